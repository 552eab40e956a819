package gvisor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/drivers/internal/hostproc"
	"github.com/amber-run/amber/lib/netns"
)

// This file holds the host objects a sandbox owns besides runsc's own
// state: its network namespace and its cgroups.

// createNetns makes the sandbox's network namespace (loopback only, up) and
// pins it on path (which must not exist). runsc (--network=sandbox) runs the
// sandbox in it and copies its interfaces and routes into the sandbox's own
// network stack; Options.Network adds the egress veth first. A restore finds
// the namespace at the same path.
func createNetns(path string) error { return netns.Create(path) }

// removeNetns unpins the namespace at path and removes the file; the
// namespace itself goes when its last process (the sandbox) has gone.
func removeNetns(path string) error { return netns.Remove(path) }

// isMountPoint reports whether path is a mount point (of anything,
// including an nsfs bind mount) according to /proc/self/mountinfo.
func isMountPoint(path string) bool {
	for _, m := range mountsUnder(path) {
		if m == path {
			return true
		}
	}
	return false
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount at or below dir.
func unmountAll(dir string) {
	for _, m := range mountsUnder(dir) {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
}

// cgroupRoot is where the v1 hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupDirs lists the directories of cgroup path in every v1 hierarchy
// that has it.
func cgroupDirs(path string) []string {
	ents, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() || e.Name() == "unified" {
			continue
		}
		p := filepath.Join(cgroupRoot, e.Name(), path)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// cgroupProcs returns the host pids in cgroup path (read from the pids
// hierarchy, falling back to memory).
func cgroupProcs(path string) []int {
	pids, _ := readCgroupProcs(path)
	return pids
}

// readCgroupProcs reads cgroup path's processes from the first controller
// that has it; ok is false when none could be read.
func readCgroupProcs(path string) (pids []int, ok bool) {
	for _, ctrl := range []string{"pids", "memory", "cpu"} {
		b, err := os.ReadFile(filepath.Join(cgroupRoot, ctrl, path, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return pids, true
	}
	return nil, false
}

// killCgroup SIGKILLs every process left in cgroup path (a sandbox whose
// runtime could not be told to stop) and waits up to timeout for them to
// go. Only processes inside the sandbox's own cgroup are touched.
func killCgroup(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupProcs(path)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v do not exit", path, pids)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeCgroup removes cgroup path from every hierarchy (children first),
// retrying briefly while the kernel still counts exiting tasks.
func removeCgroup(path string) error {
	var errs []error
	for _, dir := range cgroupDirs(path) {
		var sub []string
		_ = filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				sub = append(sub, p)
			}
			return nil
		})
		sort.Slice(sub, func(i, j int) bool { return len(sub[i]) > len(sub[j]) })
		for _, p := range sub {
			var err error
			for i := 0; i < 50; i++ {
				if err = unix.Rmdir(p); err == nil || errors.Is(err, unix.ENOENT) {
					err = nil
					break
				}
				if !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// readCgroupInt reads an integer cgroup file ("memory", "memory.max_usage_in_bytes").
func readCgroupInt(ctrl, path, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, ctrl, path, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// oomKills returns the oom_kill count of cgroup path's memory controller
// (0 when it cannot be read).
func oomKills(path string) int64 {
	return max(0, hostproc.OOMKills(filepath.Join(cgroupRoot, "memory", path)))
}
