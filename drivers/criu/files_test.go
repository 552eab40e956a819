package criu

import (
	"context"
	"os"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestFilesBenchmark: 1 MiB WriteFile and ReadFile of one sandbox through
// its agent and through the host-side confinedfs, in the same run (and
// 4 KiB, for the calls' fixed cost).
// AMBER_BENCH=1 only.
//
//	AMBER_BENCH=1 go test -tags seccomp -count=1 -run TestFilesBenchmark -v ./drivers/criu
func TestFilesBenchmark(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to measure")
	}
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	viaAgent, err := td.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := td.hostFiles(id)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second round is the figure; the first warms both
		sandboxtest.FileBench(t, "agent", viaAgent, 1<<20, 50)
		sandboxtest.FileBench(t, "confinedfs", host, 1<<20, 50)
	}
	sandboxtest.FileBench(t, "agent", viaAgent, 4<<10, 50)
	sandboxtest.FileBench(t, "confinedfs", host, 4<<10, 50)
}
