package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestUsage checks Usage against a CPU burner and a tmpfs fill
// (sandboxtest.Usage); the reference is the host's per-process CPU time of
// the processes in the sandbox's cgroup.
func TestUsage(t *testing.T) {
	td := newTestDriver(t)
	id := fmt.Sprintf("usage-%d", os.Getpid())
	sandboxtest.Usage(t, td.Driver, sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}, id, sandboxtest.UsageOptions{
		HostPIDs: func(id string) []int {
			b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", td.parent, id, "cgroup.procs"))
			var pids []int
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					pids = append(pids, n)
				}
			}
			return pids
		},
	})
}
