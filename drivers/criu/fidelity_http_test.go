package criu

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// TestCheckpointHTTPInFlight is fidelity item 4 (in-flight requests) for the
// criu driver: see core/sandbox/fidelitytest/http.go. CRIU restores the
// established connection itself: no end may be reset.
//
//	go test -tags seccomp -count=1 -run TestCheckpointHTTPInFlight -v ./drivers/criu
func TestCheckpointHTTPInFlight(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.HTTPInFlight(t, td, fidelitytest.PythonTemplate(t), fidelitytest.HTTPOptions{NoReset: true})
}

// waitProcLog polls the log of the Start'ed process pid until it has a
// line starting with prefix and returns that line.
func waitProcLog(td *testDriver, id string, pid int, prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line in the log of %d after %v: %q", prefix, pid, timeout, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
