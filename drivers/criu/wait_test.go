package criu

import (
	"context"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestWaitAcrossRestore: the exit status of a process that ended before a
// checkpoint is in the restored layer, and a process still running at the
// cut is restored with its waiter, which records its status afterwards.
//
//	go test -tags seccomp -count=1 -run TestWaitAcrossRestore -v ./drivers/criu
func TestWaitAcrossRestore(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := td.create(sandbox.Limits{})
	start := func(script string) int {
		pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	ended := start("exit 5")
	if st, err := td.Wait(ctx, id, ended); err != nil || st.Code != 5 {
		t.Fatalf("Wait before the cut = %+v, %v", st, err)
	}
	running := start("while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 6")

	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id}, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, err := td.Wait(ctx, id, ended); err != nil || st != (sandbox.ExitStatus{Code: 5}) {
		t.Errorf("Wait after restore for the process that ended before the cut = %+v, %v; want exit 5", st, err)
	}
	td.sh(id, "touch /tmp/go")
	if st, err := td.Wait(ctx, id, running); err != nil || st != (sandbox.ExitStatus{Code: 6}) {
		t.Errorf("Wait after restore for the process running at the cut = %+v, %v; want exit 6", st, err)
	}
}
