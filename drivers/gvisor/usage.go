package gvisor

import (
	"context"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.UsageReporter = (*Driver)(nil)

// Usage implements sandbox.UsageReporter from the sandbox's v1 cgroup:
// cpuacct.usage (CPU nanoseconds of the sentry, its gofer and the
// application's stub threads — everything runsc put in the cgroup) and
// memory.usage_in_bytes. The cgroup is made anew by every start and
// restore, so CPU starts again from zero then. A sandbox whose cgroup holds
// no process is not running (ErrFailedPrecondition).
func (d *Driver) Usage(ctx context.Context, id string) (sandbox.Usage, error) {
	rec, err := d.running(id)
	if err != nil {
		return sandbox.Usage{}, err
	}
	if len(cgroupProcs(rec.Cgroup)) == 0 {
		return sandbox.Usage{}, errdefs.FailedPreconditionf("sandbox %s is not running", id)
	}
	cpu, err := readCgroupInt("cpuacct", rec.Cgroup, "cpuacct.usage")
	if err != nil {
		return sandbox.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	mem, err := readCgroupInt("memory", rec.Cgroup, "memory.usage_in_bytes")
	if err != nil {
		return sandbox.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	return sandbox.Usage{CPUNanos: uint64(cpu), MemoryBytes: uint64(mem)}, nil
}
