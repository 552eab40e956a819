package engine

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
)

// Stats is one reading of a running sandbox's resources, for live graphs
// (the console's): the driver's counters (sandbox.UsageReporter) and the
// root filesystem's use as the sandbox sees it.
type Stats struct {
	Time time.Time
	// CPUNanos is cumulative since the sandbox's cgroup was made (it starts
	// again at a restore): a client graphs the rate between two readings
	// and treats a drop as a new baseline.
	CPUNanos    uint64
	MemoryBytes uint64
	// DiskUsedBytes and DiskTotalBytes are df's view of "/" inside the
	// sandbox; -1 when they could not be read (no df in the template).
	DiskUsedBytes, DiskTotalBytes int64
}

// Stats reads sandbox id's resources. It needs the sandbox running
// (ErrFailedPrecondition otherwise) and a driver that reports usage. The
// disk reading runs `df -kP /` in the sandbox (a few milliseconds of a
// process there; it bounds itself to 5 s). Reading stats is not activity:
// a sandbox watched in the console still stops when idle.
func (e *Engine) Stats(ctx context.Context, tenant, id string) (Stats, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return Stats{}, err
	}
	if sb.State != meta.StateRunning {
		return Stats{}, errdefs.FailedPreconditionf("sandbox %s is %s, not running", id, sb.State)
	}
	u, err := e.readUsage(ctx, id)
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Time: e.clock.Now(), CPUNanos: u.CPUNanos, MemoryBytes: u.MemoryBytes, DiskUsedBytes: -1, DiskTotalBytes: -1}
	// Under the hold a cut waits for (as exec), but not through enter:
	// looking is not activity (the idle timeout does not restart) and a
	// stopped sandbox is not resumed to be looked at.
	unlock, err := e.inSandbox(ctx, id)
	if err != nil {
		return st, nil // a cut held it past the call's wait: disk unknown
	}
	defer unlock()
	if cur, err := e.meta.Get(ctx, id); err != nil || cur.State != meta.StateRunning {
		return st, nil // stopped meanwhile: CPU and memory as read, disk unknown
	}
	var out bytes.Buffer
	es, err := e.drv.Exec(ctx, id, sandbox.ExecSpec{Args: dfArgs, Stdout: &out, Timeout: 5 * time.Second})
	if err == nil && es.Code == 0 {
		st.DiskUsedBytes, st.DiskTotalBytes = parseDF(out.String())
	}
	return st, nil
}

// dfArgs is the command Stats runs in a sandbox for its disk use.
var dfArgs = []string{"df", "-kP", "/"}

// isHelper reports whether a process of args is one the engine itself
// runs in sandboxes (Stats' df), not the tenant's: Processes leaves them
// out.
func isHelper(args []string) bool { return slices.Equal(args, dfArgs) }

// parseDF reads the used and total bytes from `df -kP` output (POSIX
// format: a header, then "fs 1024-blocks used available capacity mount"),
// counting fields from the end so that a device name wrapped onto its own
// line does not shift them.
func parseDF(s string) (used, total int64) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) < 2 {
		return -1, -1
	}
	f := strings.Fields(strings.Join(lines[1:], " "))
	if len(f) < 5 {
		return -1, -1
	}
	// The sandbox's df prints this (and a tenant can replace df): KiB
	// counts that are negative or overflow as bytes are refused.
	t, err1 := strconv.ParseUint(f[len(f)-5], 10, 53)
	u, err2 := strconv.ParseUint(f[len(f)-4], 10, 53)
	if err1 != nil || err2 != nil {
		return -1, -1
	}
	return int64(u) * 1024, int64(t) * 1024
}
