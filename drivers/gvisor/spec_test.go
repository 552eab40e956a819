package gvisor

import (
	"slices"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// TestOCISpec checks the spec of both generations: the /tmp bind's source
// is never inside the root; generation 1 has NoNewPrivileges and a
// nosuid,nodev /tmp; generation 0 (sandboxes and checkpoints made before
// it) stays as it was, which runsc restore requires; rootMountPoints are
// the spec's mounts in the layer.
func TestOCISpec(t *testing.T) {
	rec := &record{ID: "x", Limits: sandbox.Limits{MemoryBytes: 1 << 30, MilliCPUs: 1000, Pids: 100}}
	const rootfs, src = "/state/sandboxes/x/layer/merged", "/state/sandboxes/x/mnt/tmp"
	tmpOf := func(rec *record) (opts []string, source string) {
		for _, m := range ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent").Mounts {
			if m.Destination == "/tmp" {
				return m.Options, m.Source
			}
		}
		t.Fatal("no /tmp mount")
		return nil, ""
	}
	rec.SpecVersion = 0
	if s := ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent"); s.Process.NoNewPrivileges {
		t.Error("generation 0 has NoNewPrivileges: its checkpoints would not restore")
	}
	if opts, source := tmpOf(rec); !slices.Equal(opts, []string{"rbind", "rw"}) || source != src {
		t.Errorf("generation 0 /tmp: %q from %q", opts, source)
	}
	rec.SpecVersion = specVersion
	s := ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent")
	if !s.Process.NoNewPrivileges {
		t.Error("no NoNewPrivileges")
	}
	if opts, source := tmpOf(rec); !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") || strings.HasPrefix(source, rootfs) {
		t.Errorf("/tmp: %q from %q", opts, source)
	}
	var top []string
	for _, m := range s.Mounts {
		nested := false
		for _, o := range s.Mounts {
			if o.Destination != m.Destination && strings.HasPrefix(m.Destination, o.Destination+"/") {
				nested = true
			}
		}
		if !nested {
			top = append(top, m.Destination)
		}
	}
	if !slices.Equal(top, rootMountPoints) {
		t.Errorf("mounts in the layer %q, rootMountPoints %q", top, rootMountPoints)
	}
}
