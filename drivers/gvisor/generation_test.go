package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// TestRestoreGeneration0Image: a checkpoint of a sandbox made with the
// spec of older drivers (generation 0: no NoNewPrivileges, /tmp bound
// "rbind,rw") restores with that spec, which runsc's restore validation
// demands, its /tmp still bound by descriptor; execs in it get
// no_new_privs all the same. (A real image made by the driver before
// generation 1 was restored this way by hand: see the issue 18 notes.)
func TestRestoreGeneration0Image(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-gen")
	createSpecVersion = 0
	t.Cleanup(func() { createSpecVersion = specVersion })
	id := fmt.Sprintf("gen0-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	mustSh(t, d, id, `echo gen0-memory > /dev/shm/v; echo gen0-layer > /tmp/f`)
	imageDir := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	createSpecVersion = specVersion
	// Another node: a fresh state directory.
	d2 := newTestDriver(t, runsc, "/amber/gvisor-gen2")
	if _, err := d2.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore of a generation 0 image: %v", err)
	}
	t.Cleanup(func() { _ = d2.Destroy(context.Background(), id) })
	out := mustSh(t, d2, id, `cat /dev/shm/v /tmp/f; grep NoNewPrivs /proc/1/status /proc/self/status`)
	for _, want := range []string{"gen0-memory", "gen0-layer", "/proc/1/status:NoNewPrivs:\t0", "/proc/self/status:NoNewPrivs:\t1"} {
		if !strings.Contains(out, want) {
			t.Errorf("restored generation 0 sandbox: %q lacks %q", out, want)
		}
	}
}
