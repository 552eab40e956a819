package sandbox

import "context"

// UsageReporter is the optional power to say what a running sandbox has
// consumed, for metering (internal/engine/metering.go). The engine finds it
// by type assertion; a driver without it is not metered for CPU and memory.
//
// # Counters and their lifetime
//
// CPUNanos is cumulative: the CPU time (user + system, every process and
// the runtime's own threads that run on the sandbox's behalf) charged to
// the sandbox's cgroup since that cgroup was made. It only grows while the
// sandbox runs, and it starts again from zero whenever the cgroup is made
// anew — a restore, a restart of a killed sandbox. Callers that turn it
// into deltas must treat a value lower than the last one as a new baseline
// (a new incarnation), never as negative usage.
//
// MemoryBytes is current: the memory charged to the sandbox's cgroup at the
// moment of the call (resident memory and page cache of the sandbox, as the
// kernel's memory controller counts it).
//
// Usage of a sandbox that does not run (stopped, killed, checkpointed and
// stopped) is ErrFailedPrecondition; of an unknown one ErrNotFound.
type UsageReporter interface {
	Usage(ctx context.Context, id string) (Usage, error)
}

// Usage is one reading of a running sandbox's counters.
type Usage struct {
	CPUNanos    uint64 `json:"cpu_ns"`
	MemoryBytes uint64 `json:"memory_bytes"`
}
