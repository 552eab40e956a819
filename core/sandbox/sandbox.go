// Package sandbox is the contract between Amber's engine and an isolation
// driver (drivers/gvisor, drivers/criu).
//
// # Vocabulary
//
// A template is a read-only root filesystem plus defaults (env, working
// directory, user, limits). A sandbox is one isolated machine born from a
// template: its own writable layer on top of the template (an overlay; the
// template is shared read-only by many sandboxes), its own PID, mount, IPC,
// UTS and network namespaces, its own cgroup limits. A sandbox's network
// namespace has only loopback until the egress gateway gives it a route: no
// sandbox reaches the host's services, another sandbox, or link-local and
// metadata addresses.
//
// # Lifecycle
//
//	Create ──▶ running ──Kill──▶ crashed (processes gone, writable layer kept)
//	              │
//	              └──Destroy──▶ gone (processes, namespaces, cgroups, mounts, writable layer)
//
// Create returns once the sandbox runs an init process and accepts Exec.
// Everything a driver makes on the host (mounts, cgroups, network namespaces,
// runtime state) is named after the sandbox id and removed by Destroy, also
// after a crash of the daemon: Destroy of a half-created sandbox succeeds.
//
// A driver keeps its own state under its state directory, so that after a
// daemon restart List finds every sandbox it had and reports whether each
// still runs (the engine reattaches or marks it crashed — never forgets it).
//
// # Optional powers
//
// Checkpoint/restore and port forwarding are separate interfaces found by
// type assertion; Capabilities says what a driver can do so callers and tests
// can ask before trying.
package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// Template is what a sandbox is born from.
type Template struct {
	Name string `json:"name"`
	// Version identifies the template's content (a digest).
	Version string `json:"version"`
	// RootFS is the host path of the read-only root filesystem.
	RootFS string   `json:"rootfs"`
	Env    []string `json:"env,omitempty"`
	Cwd    string   `json:"cwd,omitempty"`
	User   string   `json:"user,omitempty"` // "uid:gid" inside the sandbox
	Limits Limits   `json:"limits,omitempty"`
}

// Limits bound a sandbox's resources. Zero means the driver's default.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// MilliCPUs: 1000 is one core.
	MilliCPUs int64 `json:"millicpus,omitempty"`
	Pids      int64 `json:"pids,omitempty"`
	// DiskBytes bounds the writable layer.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID is chosen by the engine: [a-z0-9-], at most 48 bytes.
	ID       string   `json:"id"`
	Tenant   string   `json:"tenant,omitempty"`
	Template Template `json:"template"`
	Limits   Limits   `json:"limits"`
	// Env is added to the template's env for every process.
	Env []string `json:"env,omitempty"`
}

// Capabilities declares what a driver can do.
type Capabilities struct {
	Checkpoint bool `json:"checkpoint"`
	// LazyRestore: a restored sandbox runs before all its memory is loaded.
	LazyRestore bool `json:"lazy_restore"`
	// LiveOutsideTCP: TCP connections to peers outside the sandbox survive a
	// restore. When false, such connections are reset cleanly after restore.
	LiveOutsideTCP bool `json:"live_outside_tcp"`
	PTY            bool `json:"pty"`
	PortForward    bool `json:"port_forward"`
}

// State of a sandbox as the driver sees it.
type State string

const (
	StateRunning State = "running"
	StateStopped State = "stopped" // no processes; writable layer kept (killed, crashed or checkpointed)
	StateUnknown State = "unknown"
)

// Info describes an existing sandbox.
type Info struct {
	ID      string    `json:"id"`
	State   State     `json:"state"`
	Created time.Time `json:"created"`
	// InitPID is the host PID of the sandbox's init (or its runtime), for
	// diagnostics; 0 when stopped.
	InitPID int `json:"init_pid,omitempty"`
}

// ExecSpec is one command to run inside a sandbox.
type ExecSpec struct {
	Args []string
	Env  []string // added to the sandbox's env
	Cwd  string
	// Stdin, Stdout, Stderr: nil means empty input / discarded output. The
	// driver copies through pipes; it never hands the daemon's or the
	// client's file descriptors to the sandbox.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// OpenStdin (Start only) keeps a background process's stdin open for
	// StdinWriter.WriteStdin; otherwise it reads end of file at once.
	OpenStdin bool
	// Hold (Start only) keeps the output no follower (OutputReader) has
	// read yet instead of dropping it from the sandbox's bounded ring: the
	// process waits on its full pipe, as an attached exec does, until it
	// has had no follower for 30 s (drivers with the in-sandbox agent).
	// A client that streams all of a command's output (E2B's envd) sets
	// it; without it a fast writer outruns a slow reader by the ring.
	Hold bool
	// TTY runs the command on a pseudo-terminal; Stderr is merged into Stdout.
	TTY bool
	// Size is the terminal's first size (zero: 80×24); each value from
	// Resize changes it while the command runs (drivers with the
	// in-sandbox agent; others keep the first size).
	Size   WindowSize
	Resize <-chan WindowSize
	// Timeout kills the command (SIGKILL) after this long; 0 means none.
	Timeout time.Duration
	// Started, when set, is called with the command's sandbox pid once it
	// runs, before any output (drivers whose sandboxes keep output, see
	// OutputReader; others do not call it).
	Started func(pid int)
}

// WindowSize is a terminal's size in characters.
type WindowSize struct {
	Rows, Cols uint16
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Reason says why the sandbox killed it, when the sandbox did:
	// "out of memory (limit 512 MiB)" (its memory cgroup's OOM killer). A
	// SIGKILL from anyone else has none.
	Reason string `json:"reason,omitempty"`
}

// OutOfMemory is the ExitStatus.Reason (and the start of the error) of a
// command the sandbox's memory limit killed.
func OutOfMemory(limitBytes int64) string {
	if limitBytes > 0 && limitBytes%(1<<20) == 0 {
		return fmt.Sprintf("out of memory (limit %d MiB)", limitBytes>>20)
	}
	if limitBytes > 0 {
		return fmt.Sprintf("out of memory (limit %d bytes)", limitBytes)
	}
	return "out of memory"
}

// Process is a process inside a sandbox, with its sandbox-side PID.
type Process struct {
	PID  int      `json:"pid"`
	PPID int      `json:"ppid"`
	Args []string `json:"args"`
	// Started is the process's start time as the sandbox's kernel reports it
	// (clock ticks since the sandbox's boot); tests use it to tell a
	// restored process from a restarted one.
	StartTicks uint64 `json:"start_ticks"`
	State      string `json:"state"`
}

// Network connects sandboxes to the node's egress gateway (package
// internal/egress implements it). A driver given one calls Plumb after it
// made a sandbox's network namespace and before the sandbox starts — on
// create and on every restore — and Unplumb when it destroys the sandbox.
// Without one, a sandbox has loopback only.
type Network interface {
	Plumb(ctx context.Context, id, netnsPath string) error
	Unplumb(ctx context.Context, id string) error
}

// Driver runs sandboxes. A Driver is safe for concurrent use; calls for
// different sandboxes proceed in parallel.
type Driver interface {
	Name() string
	Capabilities() Capabilities
	// Check verifies the runtime is installed and works on this host, and
	// names the command that fixes it when not.
	Check(ctx context.Context) error

	Create(ctx context.Context, spec Spec) (Info, error)
	Inspect(ctx context.Context, id string) (Info, error)
	// List returns every sandbox the driver has state for, running or not.
	List(ctx context.Context) ([]Info, error)
	// Kill SIGKILLs every process of the sandbox (a crash); the writable
	// layer stays.
	Kill(ctx context.Context, id string) error
	// Destroy removes everything of the sandbox. It is idempotent.
	Destroy(ctx context.Context, id string) error

	// Exec runs a command to completion, streaming its output.
	Exec(ctx context.Context, id string, spec ExecSpec) (ExitStatus, error)
	// Start runs a command in the background; it keeps running between
	// Execs. Its output goes to a log file inside the sandbox
	// (/run/amber/proc/<pid>.log). It returns the sandbox-side PID.
	Start(ctx context.Context, id string, spec ExecSpec) (int, error)
	Processes(ctx context.Context, id string) ([]Process, error)
	Signal(ctx context.Context, id string, pid int, sig os.Signal) error
	// Wait waits for process pid, which Start made in sandbox id, to end
	// and returns how it ended: Code is its exit code; when signal n
	// ended it, Code is 128+n and Signal names n ("SIGKILL"), as Exec
	// reports a command it killed. (A process that calls exit(128+n)
	// itself reads as killed by n: the status is taken by a shell.)
	//
	// The status is recorded inside the sandbox when the process ends,
	// in /run/amber/proc/<pid>.exit next to its log, by a waiter that is
	// the process's parent there; it does not depend on the daemon
	// watching. So Wait returns it however late it is called, any number
	// of times, after a daemon restart, and after a checkpoint and
	// restore (the file is in the writable layer; a process still
	// running is restored with its waiter). A later process that gets
	// the same PID replaces it.
	//
	// A pid that Start did not make in id is ErrNotFound. When ctx ends
	// first, Wait returns ctx's error promptly and the process runs on.
	// A sandbox that stops while Wait waits is ErrFailedPrecondition; a
	// process that ended without a recorded status (its waiter was
	// killed from inside the sandbox) is ErrDataLoss.
	Wait(ctx context.Context, id string, pid int) (ExitStatus, error)

	// Files gives access to the sandbox's filesystem, confined to it.
	Files(ctx context.Context, id string) (FS, error)
}

// PortDialer is implemented by a driver that can open TCP connections into a
// sandbox (Capabilities.PortForward). The engine finds it by type assertion.
type PortDialer interface {
	// DialPort returns a connection to 127.0.0.1:port inside sandbox id, as
	// if a process of the sandbox had dialled it: a server that listens on
	// the sandbox's loopback only is reached. The sandbox's network stays
	// closed otherwise; nothing listens on the host. A refused connection
	// (nothing listens on port) is an error; the returned conn is the
	// caller's to close, and it is independent of ctx once returned.
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    os.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	// Link is the target of a symlink, as stored (never resolved on the host).
	Link string `json:"link,omitempty"`
}

// FS is a sandbox's filesystem seen from the host. Paths are absolute
// sandbox paths ("/home/user/x"); every path is resolved inside the sandbox's
// root: "..", absolute symlinks and symlink swaps during the call cannot reach
// a host file (errdefs.ErrInvalidArgument or ErrPermissionDenied).
//
// A running sandbox whose driver serves files through the sandbox's agent
// shows what its own processes see: a file in a tmpfs it mounted, or in
// /dev/shm, is read, listed and written like any other. A stopped sandbox
// (and one without the agent) shows its root filesystem as the host keeps
// it, the writable layer on the template; tmpfs contents end with the
// sandbox's processes.
type FS interface {
	ReadFile(ctx context.Context, path string, w io.Writer) error
	WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error
	Stat(ctx context.Context, path string) (FileInfo, error)
	List(ctx context.Context, dir string) ([]FileInfo, error)
	Mkdir(ctx context.Context, path string, mode os.FileMode) error
	Remove(ctx context.Context, path string, recursive bool) error
	// Rename renames from to to, as rename(2) inside the sandbox: both
	// are absolute sandbox paths, confined like every other path; the
	// last component of each is not followed (a symlink is renamed, not
	// its target). An existing file (or symlink) at to is replaced
	// atomically; a directory may replace an empty directory only
	// (ErrFailedPrecondition when it is not empty); a directory over a
	// file, a file over a directory, a directory into itself and "/" as
	// either path are ErrInvalidArgument; a missing from (or a missing
	// parent of to) is ErrNotFound. A rename across filesystems (a
	// sandbox's tmpfs mount and its layer; also a directory of the
	// template's lower layer on an overlay without redirect_dir) is
	// ErrFailedPrecondition: nothing is copied.
	Rename(ctx context.Context, from, to string) error
	// TarOut writes a tar of path to w; TarIn extracts a tar under dir.
	TarOut(ctx context.Context, path string, w io.Writer) error
	TarIn(ctx context.Context, dir string, r io.Reader) error
}

// OutputReader is implemented by a driver whose sandboxes keep each
// process's output in the sandbox (the agent's ring), numbered by byte
// offset, so that a client re-attaches to a running or ended process from
// the last offset it saw, after a checkpoint, a restore or a daemon restart.
// The engine finds it by type assertion.
type OutputReader interface {
	// Output gives fn the output of process pid from offset on, in order,
	// each byte once, then (follow) the process's end. A Rewound frame
	// says the sandbox was restored to a cut older than offset: the stream
	// goes on from the frame's offset. A Lost frame says bytes fell out of
	// the bounded ring: the stream goes on from its offset. Without follow
	// it returns once the output written so far is sent. A pid the agent
	// does not know is ErrNotFound; fn's error ends the stream and is
	// returned.
	Output(ctx context.Context, id string, pid int, offset int64, follow bool, fn func(OutputFrame) error) error
}

// StdinWriter is implemented by a driver that feeds a background process's
// stdin (one Start made with OpenStdin; the sandbox's agent holds the
// pipe). The engine finds it by type assertion.
type StdinWriter interface {
	// WriteStdin copies r into process pid's stdin; closeAfter closes
	// the stdin at r's end (the process then reads end of file). A pid
	// the agent does not know is ErrNotFound; a process whose stdin is
	// not open (started without OpenStdin, or closed) ErrInvalidArgument.
	WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error
}

// OutputFrame is one piece of a process's output stream.
type OutputFrame struct {
	// Kind is "stdout", "stderr", "exited", "rewound" or "lost".
	Kind   string
	Offset int64
	Data   []byte
	// Exit is set on "exited"; Lost counts the bytes of a "lost" frame.
	Exit *ExitStatus
	Lost int64
}

// OrphanSweeper is implemented by a driver that can find, among the
// sandboxes running on the host, those no driver can own any more — their
// driver's state directory is gone (a data directory removed under running
// sandboxes, its daemon dead) — and kill them. `amber up` sweeps before it
// starts. It returns a line per process it killed.
type OrphanSweeper interface {
	SweepOrphans(ctx context.Context) ([]string, error)
}

// Watcher is implemented by a driver that watches files inside the sandbox
// (inotify, by the sandbox's agent), so that what the sandbox's own
// processes do is seen. The engine finds it by type assertion.
type Watcher interface {
	// Watch gives fn every change under path (recursive: in every
	// directory below it too, also ones made later) until ctx ends or fn
	// fails. ready, when not nil, is closed once the watch is in place.
	Watch(ctx context.Context, id, path string, recursive bool, ready chan<- struct{}, fn func(WatchEvent) error) error
}

// WatchEvent is one change: Op is create, write, remove, rename or chmod
// ("overflow": events were dropped; Path is empty).
type WatchEvent struct {
	Path string `json:"path"`
	Op   string `json:"op"`
}
