package gvisor

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.OrphanSweeper = (*Driver)(nil)

// SweepOrphans implements sandbox.OrphanSweeper: it kills the gVisor
// sandboxes of this host whose driver state is gone — a runsc sandbox or
// gofer process whose --root is a driver's runsc-root directory that no
// longer exists (a data directory removed under a running sandbox, its
// daemon dead). Nothing can own such a sandbox any more: no daemon finds it,
// and it holds memory, CPU and its network namespace for good. A sandbox
// whose root directory exists is never touched, whoever's it is.
func (d *Driver) SweepOrphans(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var killed []string
	var cgroups []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		args := procArgs(pid)
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "runsc") {
			continue
		}
		root := flagValue(args, "--root")
		if root == "" || filepath.Base(root) != "runsc-root" || root == d.root {
			continue
		}
		if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		cgroups = append(cgroups, amberCgroups(pid)...)
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed = append(killed, filepath.Base(args[0])+" pid "+strconv.Itoa(pid)+" (root "+root+")")
		}
	}
	// Their cgroups, once empty (best effort).
	deadline := time.Now().Add(5 * time.Second)
	for _, cg := range cgroups {
		for os.Remove(cg) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return killed, ctx.Err()
}

// procArgs is pid's command line.
func procArgs(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// flagValue is the value of --name=value (or --name value) in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// amberCgroups lists the v1 cgroup directories of pid under an /amber/
// parent (the drivers' parents), for removal once it has exited.
func amberCgroups(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/amber/") || f[1] == "" {
			continue
		}
		ctrl := strings.TrimPrefix(f[1], "name=")
		out = append(out, filepath.Join(cgroupRoot, ctrl, f[2]))
	}
	return out
}
