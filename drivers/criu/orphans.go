package criu

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/hostproc"
	"github.com/amber-run/amber/lib/agentproto"
)

var _ sandbox.OrphanSweeper = (*Driver)(nil)

// SweepOrphans implements sandbox.OrphanSweeper: it kills the criu
// sandboxes of this host whose driver state is gone — a sandbox init (the
// agent, run from agentproto.Path) whose root is an overlay with an upper
// directory that no longer exists on the host (a data directory removed
// under a running sandbox, its daemon dead). Every process of the orphan's
// cgroup goes (thawed first if it was frozen). A sandbox whose layer exists
// is never touched, whoever's it is; sandboxes of the sh init (before the
// agent) are not recognized.
func (d *Driver) SweepOrphans(ctx context.Context) ([]string, error) {
	pids, err := hostproc.Pids()
	if err != nil {
		return nil, err
	}
	var killed []string
	for _, pid := range pids {
		if args := hostproc.Args(pid); len(args) == 0 || args[0] != agentproto.Path {
			continue
		}
		upper := rootUpperDir(pid)
		if upper == "" || !strings.HasPrefix(upper, "/") {
			continue
		}
		if _, err := os.Lstat(upper); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		n := killCgroupOf(pid)
		killed = append(killed, "sandbox init pid "+strconv.Itoa(pid)+" and "+strconv.Itoa(n)+" processes of its cgroup (layer "+upper+")")
	}
	return killed, ctx.Err()
}

// rootUpperDir is the upperdir of the overlay mounted at the root of pid's
// mount namespace ("" when its root is not such an overlay).
func rootUpperDir(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent maj:min root mountpoint options [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || f[4] != "/" || len(g) < 3 || g[0] != "overlay" {
			continue
		}
		for _, o := range strings.Split(g[2], ",") {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v
			}
		}
	}
	return ""
}

// killCgroupOf SIGKILLs every process of pid's freezer cgroup (thawed
// first), or pid alone when it has none under /amber/, and returns how
// many it signalled.
func killCgroupOf(pid int) int {
	dir := hostproc.AmberCgroups("/sys/fs/cgroup", pid)["freezer"]
	if dir == "" {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 1
	}
	_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0o644)
	n := 0
	for round := 0; round < 50; round++ {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(procs))) == 0 {
			break
		}
		for _, s := range strings.Fields(string(procs)) {
			if p, err := strconv.Atoi(s); err == nil {
				if unix.Kill(p, unix.SIGKILL) == nil && round == 0 {
					n++
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}
