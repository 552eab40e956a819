package criu

import (
	"errors"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// TestRestoreLosses: the fidelity report names the cut's processes that
// are gone after the restore and the connections reset, says when it
// could not look, and is empty when everything came back.
func TestRestoreLosses(t *testing.T) {
	meta := &imageMeta{StartTicks: map[int]uint64{7: 1, 9: 2, 12: 3}, Connections: 3}
	all := []sandbox.Process{{PID: 7}, {PID: 9}, {PID: 12}, {PID: 40}}
	if got := restoreLosses(meta, all, nil, 0); len(got) != 0 {
		t.Fatalf("all back: %+v, want nothing", got)
	}
	got := restoreLosses(meta, []sandbox.Process{{PID: 9}}, nil, 2)
	if len(got) != 2 || got[0].Kind != sandbox.LossProcesses || got[0].Count != 2 || !strings.Contains(got[0].Detail, "[7 12]") ||
		got[1].Kind != sandbox.LossConnections || got[1].Count != 2 || !strings.Contains(got[1].Detail, "2 of 3") {
		t.Fatalf("two processes and two connections lost: %+v", got)
	}
	got = restoreLosses(meta, nil, errors.New("cgroup gone"), 0)
	if len(got) != 1 || got[0].Kind != sandbox.LossUnverified || !strings.Contains(got[0].Detail, "cgroup gone") {
		t.Fatalf("processes unreadable: %+v, want unverified", got)
	}
}
