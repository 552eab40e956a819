// Package hostproc reads the host's /proc for the drivers' sweeps: which
// processes run, their command lines, their v1 cgroups. It is what both
// drivers' orphan sweeps (sandbox.OrphanSweeper) walk, and the OOM
// counts both drivers read from a sandbox's memory cgroup.
package hostproc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Pids lists the host's processes, this one left out.
func Pids() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != self {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Args is pid's command line (nil when it is gone or a kernel thread).
func Args(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// AmberCgroups maps each v1 controller of pid (as named in /proc/<pid>/cgroup,
// "memory", "cpu,cpuacct", "freezer") to its cgroup directory under root
// (/sys/fs/cgroup), for the cgroups under an /amber/ parent (the drivers')
// only.
func AmberCgroups(root string, pid int) map[string]string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" || !strings.HasPrefix(f[2], "/amber/") {
			continue
		}
		ctrl := strings.TrimPrefix(f[1], "name=")
		out[ctrl] = filepath.Join(root, ctrl, f[2])
	}
	return out
}

// OOMKills is the oom_kill count in memory.oom_control of the v1 memory
// cgroup directory dir, or -1 when it cannot be read.
func OOMKills(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}
