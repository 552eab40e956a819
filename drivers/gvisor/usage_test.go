package gvisor

import (
	"fmt"
	"os"
	"testing"

	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestUsage checks Usage against a CPU burner and a tmpfs fill
// (sandboxtest.Usage); the reference is the host's per-process CPU time of
// the sentry, gofer and stub processes in the sandbox's cgroup.
func TestUsage(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	d := newTestDriver(t, runsc, "/amber/gvisor-usage")
	id := fmt.Sprintf("usage-%d", os.Getpid())
	sandboxtest.Usage(t, d, tmpl, id, sandboxtest.UsageOptions{
		HostPIDs: func(id string) []int { return cgroupProcs(d.cgroupPath(id)) },
	})
}
