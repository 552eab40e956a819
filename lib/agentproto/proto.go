// Package agentproto is the wire protocol between the daemon (through a
// driver) and amber-agent, the small program that is every sandbox's init.
//
// # Transport
//
// The agent listens on 127.0.0.1:Port inside the sandbox's own network
// namespace; the driver opens connections to it with its port dialer (never
// through the sandbox's outside network). Every connection speaks HTTP/2
// without TLS (h2c, "prior knowledge"): one connection carries every call
// concurrently, so a call costs a stream, not a dial (a gvisor dial starts a
// runsc process).
//
// Every request carries the header TokenHeader with the sandbox's agent
// token: a random value the driver gives the agent in its environment at
// boot (the agent removes it from the environment it hands on; its own
// initial environment, /proc/1/environ, is readable only by the agent's user,
// the sandbox's root, who may do what the agent does anyway), so a process of a non-root template user cannot ask the
// agent, which runs as the sandbox's root, to start something as root. The
// token grants nothing outside the one sandbox; it is not a credential of the
// host or of a tenant.
//
// # Calls (JSON bodies unless said otherwise)
//
//	GET  /v1/health                     → Health
//	POST /v1/processes          Start   → Started
//	POST /v1/processes?attach=1 Start   → PIDHeader, then the stream of
//	                                      frames of output?offset=0&follow=1
//	                                      (an exec in one round trip; an
//	                                      agent before 1.1 answers Started,
//	                                      and the host then asks for output)
//	GET  /v1/processes                  → []Process (the agent itself left out)
//	GET  /v1/processes/{pid}/output?offset=N[&follow=1]
//	                                    → a stream of frames (Frame, binary)
//	POST /v1/processes/{pid}/stdin?close=1   body: raw bytes → 204
//	POST /v1/processes/{pid}/signal     Signal → 204
//	POST /v1/processes/{pid}/resize     Resize → 204
//	GET  /v1/processes/{pid}/wait       → Exit (blocks until the process ends)
//	GET  /v1/watch?path=P[&recursive=1] → a stream of WatchEvent, one JSON per line
//
// Files (since 1.1; see HasFiles). Paths are absolute sandbox paths, resolved
// by the agent in the sandbox's own mount namespace (so tmpfs mounts, /dev/shm
// and anything else the sandbox mounted are seen), cleaned as CleanPath does:
//
//	GET  /v1/files?path=P&max=N         → the regular file's bytes (at most N; none of /proc)
//	PUT  /v1/files?path=P&mode=M        body: raw bytes → 204 (atomic replace)
//	GET  /v1/files/stat?path=P          → FileInfo (lstat)
//	GET  /v1/files/list?path=P          → a stream of FileInfo, one JSON per line, sorted by name
//	POST /v1/files/mkdir                Mkdir → 204
//	POST /v1/files/rename               Rename → 204
//	POST /v1/files/remove               Remove → 204
//
// An error is a status ≥ 400 with an Error body. The host treats everything
// the agent answers as untrusted input: bodies are read through size limits
// (MaxJSON, MaxFrameData) and the frame decoder is fuzzed.
//
// # Versions
//
// Version is the protocol's version; Health reports it and the host refuses
// an agent of another major version. A checkpoint records the agent's build
// (its binary's digest), so a restore runs the very binary the checkpointed
// process has mapped.
package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Version is the protocol version: "major.minor". The host accepts an agent
// whose major version equals its own.
//
// 1.1 added the file calls and the attached start; an agent of 1.0 (one
// recorded in an older checkpoint) lacks them: the host serves files
// itself (HasFiles) and asks for an exec's output after its start. 1.2
// added GET /v1/census; an older agent answers it 404, and the host counts
// with an exec instead.
const Version = "1.2"

// Major is Version's major number.
const Major = 1

// Port is the agent's TCP port on the sandbox's loopback.
const Port = 49983

// TokenHeader carries the sandbox's agent token on every request.
const TokenHeader = "X-Amber-Agent-Token"

// PIDHeader names the process an attached start started (or had started
// under the same key), before its output frames.
const PIDHeader = "X-Amber-Pid"

// TokenEnv is the environment variable the agent reads its token from at
// boot (and removes).
const TokenEnv = "AMBER_AGENT_TOKEN"

// Path is where the drivers put the agent's binary inside every sandbox
// (read-only, in /dev's tmpfs, so not in the writable layer).
const Path = "/dev/.amber-agent"

// Limits on what either side reads from the other.
const (
	// MaxJSON bounds a JSON body or one JSON line.
	MaxJSON = 1 << 20
	// MaxFrameData bounds one output frame's data.
	MaxFrameData = 256 << 10
	// DefaultRing is the output kept per process when Start names none.
	DefaultRing = 1 << 20
	// MaxRing bounds Start.RingBytes.
	MaxRing = 16 << 20
)

// Health answers GET /v1/health.
type Health struct {
	Protocol string `json:"protocol"` // Version
	Build    string `json:"build"`    // the agent binary's build id
	PID      int    `json:"pid"`      // the agent's own sandbox PID
	Init     bool   `json:"init"`     // it is the sandbox's PID 1
}

// Census answers GET /v1/census: what a restore's fidelity report counts,
// read by the agent itself, so that a restore starts no process to learn
// it (a process start in a sandbox is dear on a loaded host).
type Census struct {
	// Processes counts every process of the sandbox, the agent included.
	Processes int `json:"processes"`
	// TCPEstablished counts established TCP sockets (/proc/net/tcp, tcp6).
	TCPEstablished int `json:"tcp_established"`
}

// CountEstablished counts the lines of a /proc/net/tcp or tcp6 table
// whose state (the fourth column) is 01, TCP_ESTABLISHED.
func CountEstablished(table string) int {
	n := 0
	for line := range strings.Lines(table) {
		if f := strings.Fields(line); len(f) > 3 && f[3] == "01" {
			n++
		}
	}
	return n
}

// Start is a process to start.
type Start struct {
	// Args is the argv; when Shell is set, Args is empty and the command
	// is `/bin/sh -c Shell`.
	Args  []string `json:"args,omitempty"`
	Shell string   `json:"shell,omitempty"`
	// Env is the whole environment (the host merges template, sandbox and
	// call); the agent adds nothing.
	Env []string `json:"env"`
	Cwd string   `json:"cwd"`
	UID uint32   `json:"uid"`
	GID uint32   `json:"gid"`
	// TTY runs it on a new pseudo-terminal of Rows×Cols (stderr merged
	// into stdout).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Stdin keeps the process's stdin open for POST …/stdin; otherwise it
	// reads end of file at once.
	Stdin bool `json:"stdin,omitempty"`
	// Log also writes its output to LogDir/<pid>.log and its exit status
	// to LogDir/<pid>.exit (background processes; see procwait).
	Log bool `json:"log,omitempty"`
	// Hold: an attached command (exec). Output no follower has read yet
	// is never dropped from the ring: the process waits on its full pipe
	// instead, as behind a slow reader; after 30 s without a follower the
	// ring drops output again.
	Hold bool `json:"hold,omitempty"`
	// Key, when set, makes the start idempotent: a second start with the
	// key of a recent one answers that one's pid and starts nothing (a
	// client whose connection broke mid-call asks again).
	Key string `json:"key,omitempty"`
	// TimeoutMS kills its process group after this long (0: never).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// RingBytes is how much output is kept for re-attach (0: DefaultRing).
	RingBytes int `json:"ring_bytes,omitempty"`
}

// LogDir is where Start.Log writes, inside the sandbox.
const LogDir = "/run/amber/proc"

// Started answers POST /v1/processes.
type Started struct {
	PID int `json:"pid"`
}

// Process is one process of the sandbox.
type Process struct {
	PID        int      `json:"pid"`
	PPID       int      `json:"ppid"`
	Args       []string `json:"args"`
	StartTicks uint64   `json:"start_ticks"`
	State      string   `json:"state"`
}

// Signal asks for a signal to a process (Group: to its process group).
type Signal struct {
	Signal int  `json:"signal"`
	Group  bool `json:"group,omitempty"`
}

// Resize sets a TTY process's window size.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Exit is how a process ended: Code is its exit code, or 128+n when signal
// n ended it, and then Signal names n ("SIGKILL").
type Exit struct {
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// LifeMicros is the time from the agent's fork to its reap of the
	// process, in microseconds: what the sandbox's kernel spent on the
	// process's whole life, without the round trips to the host (a
	// benchmark's floor). Informational; 0 from an older agent.
	LifeMicros int64 `json:"life_us,omitempty"`
}

// WatchEvent is one change under a watched path.
type WatchEvent struct {
	Path string `json:"path"`
	// Op is one of create, write, remove, rename, chmod; "overflow" means
	// events were dropped.
	Op string `json:"op"`
}

// HasFiles says whether an agent of protocol version v serves the file
// calls (1.1 and later).
func HasFiles(v string) bool {
	major, minor, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	return err1 == nil && err2 == nil && ma == Major && mi >= 1
}

// Error is the body of a failed call.
type Error struct {
	// Code is a short class: not_found, invalid, unavailable, denied,
	// exists, precondition (a directory not empty, a cross-device
	// rename), exhausted (no space, too large, too many entries),
	// internal.
	Code    string `json:"code"`
	Message string `json:"message"`
}

// FrameKind says what a frame carries.
type FrameKind uint8

const (
	// Stdout and Stderr carry output starting at Offset.
	Stdout FrameKind = 1
	Stderr FrameKind = 2
	// Exited: the process ended and every byte it wrote before that was
	// sent; Data is an Exit in JSON. Offset is the end of its output.
	Exited FrameKind = 3
	// Rewound: the offset asked for lies beyond what the process has
	// written (the sandbox was restored to an older cut); the stream goes
	// on from Offset, the end of what it has written.
	Rewound FrameKind = 4
	// Lost: bytes from the offset asked for up to Offset fell out of the
	// ring; Data is their count as 8 bytes, big endian. The stream goes on
	// from Offset.
	Lost FrameKind = 5
)

func (k FrameKind) String() string {
	switch k {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case Exited:
		return "exited"
	case Rewound:
		return "rewound"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Frame is one unit of a process's output stream. On the wire: kind (1
// byte), offset (8 bytes, big endian), data length (4 bytes, big endian),
// data.
type Frame struct {
	Kind   FrameKind
	Offset int64
	Data   []byte
}

const frameHeader = 13

// ErrFrame is a malformed frame.
var ErrFrame = errors.New("agentproto: malformed frame")

// WriteFrame writes f to w in one Write.
func WriteFrame(w io.Writer, f Frame) error {
	if len(f.Data) > MaxFrameData {
		return fmt.Errorf("%w: %d bytes of data (at most %d)", ErrFrame, len(f.Data), MaxFrameData)
	}
	b := make([]byte, frameHeader+len(f.Data))
	b[0] = byte(f.Kind)
	binary.BigEndian.PutUint64(b[1:9], uint64(f.Offset))
	binary.BigEndian.PutUint32(b[9:13], uint32(len(f.Data)))
	copy(b[frameHeader:], f.Data)
	_, err := w.Write(b)
	return err
}

// ReadFrame reads one frame. It returns io.EOF at a clean end between
// frames and ErrFrame (wrapped) for anything malformed: an unknown kind, a
// negative offset, data longer than MaxFrameData, a truncated frame, or an
// exit or lost frame whose data does not parse.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:1]); err != nil {
		return Frame{}, err
	}
	if _, err := io.ReadFull(r, h[1:]); err != nil {
		return Frame{}, fmt.Errorf("%w: truncated header: %v", ErrFrame, err)
	}
	f := Frame{Kind: FrameKind(h[0]), Offset: int64(binary.BigEndian.Uint64(h[1:9]))}
	n := binary.BigEndian.Uint32(h[9:13])
	if f.Kind < Stdout || f.Kind > Lost {
		return Frame{}, fmt.Errorf("%w: unknown kind %d", ErrFrame, h[0])
	}
	if f.Offset < 0 {
		return Frame{}, fmt.Errorf("%w: negative offset", ErrFrame)
	}
	if n > MaxFrameData {
		return Frame{}, fmt.Errorf("%w: %d bytes of data (at most %d)", ErrFrame, n, MaxFrameData)
	}
	f.Data = make([]byte, n)
	if _, err := io.ReadFull(r, f.Data); err != nil {
		return Frame{}, fmt.Errorf("%w: truncated data: %v", ErrFrame, err)
	}
	switch f.Kind {
	case Exited:
		if _, err := f.Exit(); err != nil {
			return Frame{}, err
		}
	case Lost:
		if len(f.Data) != 8 {
			return Frame{}, fmt.Errorf("%w: lost frame with %d bytes of data", ErrFrame, len(f.Data))
		}
	}
	return f, nil
}

// Exit parses an Exited frame's data.
func (f Frame) Exit() (Exit, error) {
	var e Exit
	if err := json.Unmarshal(f.Data, &e); err != nil {
		return Exit{}, fmt.Errorf("%w: exit frame: %v", ErrFrame, err)
	}
	if e.Code < 0 || e.Code > 255 || len(e.Signal) > 16 {
		return Exit{}, fmt.Errorf("%w: exit frame out of range", ErrFrame)
	}
	return e, nil
}

// LostBytes is a Lost frame's count.
func (f Frame) LostBytes() int64 {
	if len(f.Data) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(f.Data))
}

// LostFrame makes a Lost frame: n bytes lost before offset.
func LostFrame(offset, n int64) Frame {
	d := make([]byte, 8)
	binary.BigEndian.PutUint64(d, uint64(n))
	return Frame{Kind: Lost, Offset: offset, Data: d}
}

// ExitFrame makes an Exited frame at offset.
func ExitFrame(offset int64, e Exit) Frame {
	b, _ := json.Marshal(e)
	return Frame{Kind: Exited, Offset: offset, Data: b}
}
