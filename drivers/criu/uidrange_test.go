package criu

import (
	"errors"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

// TestSlotOf: an image's uid range is found on this driver's grid, or on the
// old default's (checkpoints made before the default base moved restore
// into the range they were cut in, under a claim number of their own),
// unless that grid overlaps this driver's; anything else is refused.
func TestSlotOf(t *testing.T) {
	d := plainDriver(t, Options{})
	for _, c := range []struct {
		host, slot int
		ok         bool
	}{
		{DefaultUIDBase, 0, true},
		{DefaultUIDBase + 5*idsPerSandbox, 5, true},
		{DefaultUIDBase + DefaultMaxSandboxes*idsPerSandbox, 0, false},
		{DefaultUIDBase + 1, 0, false},
		{legacyUIDBase, legacySlots, true},
		{legacyUIDBase + 7*idsPerSandbox, legacySlots + 7, true},
		{legacyUIDBase + legacyMaxSandboxes*idsPerSandbox, 0, false},
		{legacyUIDBase + 100, 0, false},
		{0, 0, false},
	} {
		slot, err := d.slotOf(c.host)
		if c.ok && (err != nil || slot != c.slot) {
			t.Errorf("slotOf(%d) = %d, %v; want %d", c.host, slot, err, c.slot)
		}
		if !c.ok && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("slotOf(%d) = %d, %v; want a FailedPrecondition", c.host, slot, err)
		}
	}
	// A base whose grid overlaps the old default's: a legacy image could
	// share host ids with one of this driver's sandboxes, so it is refused.
	o := plainDriver(t, Options{UIDBase: 200000})
	if _, err := o.slotOf(legacyUIDBase + 3*idsPerSandbox); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("legacy range under an overlapping base: %v", err)
	}
	if s, err := o.slotOf(200000 + 2*idsPerSandbox); err != nil || s != 2 {
		t.Errorf("own range under base 200000: %d %v", s, err)
	}
}

// TestContainerConfigMountPoints keeps rootMountPoints equal to the
// config's mounts that lie in the layer.
func TestContainerConfigMountPoints(t *testing.T) {
	d := plainDriver(t, Options{})
	cfg := d.containerConfig(&record{ID: "x", Limits: DefaultLimits, HostID: DefaultUIDBase}, "/r", "/agent")
	var top []string
	for _, m := range cfg.Mounts {
		nested := false
		for _, o := range cfg.Mounts {
			if o.Destination != m.Destination && len(m.Destination) > len(o.Destination) && m.Destination[:len(o.Destination)+1] == o.Destination+"/" {
				nested = true
			}
		}
		if !nested {
			top = append(top, m.Destination)
		}
	}
	if len(top) != len(rootMountPoints) {
		t.Fatalf("mounts in the layer %q, rootMountPoints %q", top, rootMountPoints)
	}
	for i := range top {
		if top[i] != rootMountPoints[i] {
			t.Fatalf("mounts in the layer %q, rootMountPoints %q", top, rootMountPoints)
		}
	}
}
