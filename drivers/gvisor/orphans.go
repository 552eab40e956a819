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
	"github.com/amber-run/amber/drivers/internal/hostproc"
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
	pids, err := hostproc.Pids()
	if err != nil {
		return nil, err
	}
	var killed []string
	var cgroups []string
	for _, pid := range pids {
		args := hostproc.Args(pid)
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
		for _, dir := range hostproc.AmberCgroups(cgroupRoot, pid) {
			cgroups = append(cgroups, dir)
		}
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
