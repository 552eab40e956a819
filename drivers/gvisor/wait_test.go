package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestWaitAcrossRestore: the exit status of a process that ended before a
// checkpoint is in the restored layer, and a process still running at the
// cut is restored with its waiter, which records its status afterwards.
//
//	go test -tags seccomp -count=1 -run TestWaitAcrossRestore -v ./drivers/gvisor
func TestWaitAcrossRestore(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-wait")
	id := fmt.Sprintf("wait-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: minimalTemplate(t)}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	start := func(script string) int {
		pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	ended := start("exit 5")
	if st, err := d.Wait(ctx, id, ended); err != nil || st.Code != 5 {
		t.Fatalf("Wait before the cut = %+v, %v", st, err)
	}
	running := start("while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 6")

	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Wait(ctx, id, ended); err != nil || st != (sandbox.ExitStatus{Code: 5}) {
		t.Errorf("Wait after restore for the process that ended before the cut = %+v, %v; want exit 5", st, err)
	}
	mustSh(t, d, id, "touch /tmp/go")
	if st, err := d.Wait(ctx, id, running); err != nil || st != (sandbox.ExitStatus{Code: 6}) {
		t.Errorf("Wait after restore for the process running at the cut = %+v, %v; want exit 6", st, err)
	}
}
