package sandbox

import (
	"context"
	"time"
)

// Checkpointer is the optional power to cut a sandbox into an image and
// bring it back (Capabilities.Checkpoint). Drivers: gvisor (runsc
// checkpoint/restore) and criu (CRIU through libcontainer).
//
// # Vocabulary
//
// An image is a directory the driver fills: the process tree and memory in
// the runtime's own format, plus the sandbox's writable layer (the files it
// changed on top of its template), plus a small image.json the driver needs
// to restore (runtime flags, template version, ids). The image is complete:
// with it and the template, Restore rebuilds the sandbox on a node that never
// saw it (a fresh state directory). The engine stores images with
// internal/state/chunkstore; the driver never sees the blob store.
//
// # Consistency
//
// Checkpoint freezes every process of the sandbox before the first byte of
// the image is written and captures memory, processes and the writable layer
// as of that one frozen moment (a consistent cut), then resumes the sandbox
// (or leaves it stopped when asked). Image files are written uncompressed so
// that content-defined chunking deduplicates unchanged regions.
//
// # Restore
//
// Restore starts spec.ID from the image: the same process tree with the same
// PIDs inside the sandbox, the same memory, the same files and environment.
// A sandbox with that id must not be running (a stopped one is replaced).
// Connections to peers outside the sandbox are restored when
// Capabilities.LiveOutsideTCP, otherwise reset (the program sees an error,
// never a hang).
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, imageDir string, opts CheckpointOptions) (CheckpointStats, error)
	Restore(ctx context.Context, spec Spec, imageDir string, opts RestoreOptions) (RestoreStats, error)
}

// CheckpointOptions tune Checkpoint.
type CheckpointOptions struct {
	// LeaveStopped: do not resume the sandbox after the cut.
	LeaveStopped bool
}

// CheckpointStats report what a checkpoint cost.
type CheckpointStats struct {
	// Frozen is how long the sandbox's processes could not run.
	Frozen time.Duration `json:"frozen_ns"`
	Total  time.Duration `json:"total_ns"`
	// MemoryBytes is the size of the memory image; LayerBytes of the layer.
	MemoryBytes int64 `json:"memory_bytes"`
	LayerBytes  int64 `json:"layer_bytes"`
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// Lazy starts the sandbox before all memory is loaded, where the driver
	// can (Capabilities.LazyRestore); ignored otherwise.
	Lazy bool
}

// RestoreStats report what a restore did; they feed the fidelity report.
type RestoreStats struct {
	// Running is the time from the call to the sandbox running again.
	Running   time.Duration `json:"running_ns"`
	Processes int           `json:"processes"`
	// MemoryBytes restored (or mapped lazily when Lazy).
	MemoryBytes int64 `json:"memory_bytes"`
	Files       int   `json:"files"`
	// ConnectionsRestored / ConnectionsReset count TCP connections.
	ConnectionsRestored int  `json:"connections_restored"`
	ConnectionsReset    int  `json:"connections_reset"`
	Lazy                bool `json:"lazy"`
	// Loaded, for a lazy restore, reports the end of the background load:
	// nil once every page is in the sandbox, else why the load failed (the
	// driver has then killed the sandbox: its memory is incomplete). One
	// value, then closed; nil for an eager restore. The image directory
	// given to Restore must stay until then.
	Loaded <-chan error `json:"-"`
	// NotRestored lists every kind of state the driver knows it did not
	// bring back (empty: all it can check came back). A driver that could
	// not check a kind says so (LossUnverified) rather than leave it out.
	NotRestored []Loss `json:"not_restored,omitempty"`
}

// Loss is one kind of state a restore did not bring back: the fidelity
// report's negative half.
type Loss struct {
	Kind   string `json:"kind"`
	Count  int    `json:"count,omitempty"`
	Detail string `json:"detail"`
}

// The kinds of Loss.
const (
	// LossProcesses: processes of the cut missing after the restore.
	LossProcesses = "processes"
	// LossConnections: TCP connections of the cut reset (their peer
	// outside the sandbox did not survive, or the driver cannot restore
	// them, e.g. after a crash).
	LossConnections = "tcp-connections"
	// LossCheckpoints: newer checkpoints whose image was lost before
	// their upload; the restore fell back past them (the engine's).
	LossCheckpoints = "checkpoints"
	// LossUnverified: a kind the driver could not check this time.
	LossUnverified = "unverified"
)

// RuntimeReporter is implemented by a driver that can name the exact build
// of the runtime its images come from (for gvisor the runsc module version
// and the binary's digest; for criu CRIU's version and the binary's
// digest). The engine records it in every checkpoint manifest and refuses
// to restore an image on a node whose runtime build differs: a memory image
// is only known to load into the runtime that wrote it.
type RuntimeReporter interface {
	RuntimeBuild(ctx context.Context) (string, error)
}
