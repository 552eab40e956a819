package gvisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// TestCheckpointHTTPInFlight is fidelity item 4 (in-flight requests) for the
// gvisor driver: see core/sandbox/fidelitytest/http.go.
//
//	go test -tags seccomp -count=1 -run TestCheckpointHTTPInFlight -v ./drivers/gvisor
func TestCheckpointHTTPInFlight(t *testing.T) {
	runsc := requireHost(t)
	fidelitytest.HTTPInFlight(t, newTestDriver(t, runsc, "/amber/gvisor-http"), fidelitytest.PythonTemplate(t), fidelitytest.HTTPOptions{})
}

// waitProcLog polls the log of the Start'ed process pid until it has a
// line starting with prefix and returns that line.
func waitProcLog(d *Driver, id string, pid int, prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out, err := sh(d, id, fmt.Sprintf("cat %s/%d.log", procLogDir, pid))
		if err == nil {
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, prefix) {
					return l, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line in the log of %d after %v: %q (%v)", prefix, pid, timeout, out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pidTicks returns the start ticks of pids (absent ones are left out).
func pidTicks(ps []sandbox.Process, pids ...int) map[int]uint64 {
	m := map[int]uint64{}
	for _, p := range ps {
		for _, want := range pids {
			if p.PID == want {
				m[p.PID] = p.StartTicks
			}
		}
	}
	return m
}
