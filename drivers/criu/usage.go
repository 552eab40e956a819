package criu

import (
	"context"
	"fmt"

	"github.com/opencontainers/cgroups/manager"

	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.UsageReporter = (*Driver)(nil)

// Usage implements sandbox.UsageReporter through libcontainer's cgroup
// manager: the v1 cpuacct total (CPU nanoseconds of every process of the
// sandbox) and the memory controller's current usage. A restore makes the
// cgroup anew, so CPU starts again from zero then. A sandbox that is not
// running is ErrFailedPrecondition.
func (d *Driver) Usage(ctx context.Context, id string) (sandbox.Usage, error) {
	ls, err := d.running(id)
	if err != nil {
		return sandbox.Usage{}, err
	}
	cm, err := manager.New(ls.c.Config().Cgroups)
	if err != nil {
		return sandbox.Usage{}, recordErr(id, err)
	}
	st, err := cm.GetStats()
	if err != nil {
		return sandbox.Usage{}, recordErr(id, fmt.Errorf("cgroup stats: %w", err))
	}
	return sandbox.Usage{CPUNanos: st.CpuStats.CpuUsage.TotalUsage, MemoryBytes: st.MemoryStats.Usage.Usage}, nil
}
