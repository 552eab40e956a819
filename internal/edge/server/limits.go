package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Limits bound what one request may ask of the daemon, so that a client
// (or a bug in one) cannot exhaust its memory or goroutines. Each refusal
// names the limit: 413 for sizes, 400 for counts in a request and for a
// sandbox above the maxima, 429 for calls at once. Zero fields take the defaults (DefaultLimits).
type Limits struct {
	// MaxBodyBytes bounds a JSON request body (max_body_bytes). Bodies are
	// decoded in memory; file contents and tars stream and are bounded by
	// MaxUploadBytes instead.
	MaxBodyBytes int64
	// MaxUploadBytes bounds one file or tar upload (max_upload_bytes). The
	// sandbox's disk limit still applies below it.
	MaxUploadBytes int64
	// MaxArgs, MaxEnv and MaxCommandBytes bound one command: its arguments
	// (max_args), its environment entries — and a new sandbox's (max_env) —
	// and the bytes of both together (max_command_bytes), like the
	// kernel's ARG_MAX.
	MaxArgs, MaxEnv, MaxCommandBytes int
	// MaxExecsPerSandbox bounds the exec calls streaming into one sandbox
	// at once (max_execs_per_sandbox): each holds pipes and goroutines in
	// the daemon for as long as the command runs. Background processes
	// are bounded inside the sandbox by its pids limit.
	MaxExecsPerSandbox int
	// MaxStreamsPerTenant bounds the long-lived streams one tenant holds
	// open on this daemon at once (max_streams_per_tenant): followed
	// events, session SSE, exec, process waits and terminals (streams.go).
	MaxStreamsPerTenant int
	// BodyReadTimeout bounds the wait for a request body's next bytes
	// (body_read_timeout): a client that stops sending mid-body gets a
	// 400 and its connection is closed, instead of holding a connection
	// and a handler forever (bodytimeout.go).
	BodyReadTimeout time.Duration
	// MaxSandbox is the most a sandbox may ask for (max_sandbox_memory,
	// max_sandbox_cpus, max_sandbox_pids, max_sandbox_disk): a create above
	// it is a 400 naming the maximum. Zero fields take the node's size
	// (DefaultMaxSandbox).
	MaxSandbox sandbox.Limits
}

// DefaultLimits are the limits of a Server whose Options leave them zero.
var DefaultLimits = Limits{
	MaxBodyBytes:        8 << 20,
	MaxUploadBytes:      1 << 30,
	MaxArgs:             4096,
	MaxEnv:              4096,
	MaxCommandBytes:     1 << 20,
	MaxExecsPerSandbox:  256,
	MaxStreamsPerTenant: 128,
	BodyReadTimeout:     time.Minute,
}

// DefaultMaxSandbox is the largest sandbox a node can hold: its memory
// and CPUs, 32768 processes and 256 GiB of disk. `amber up
// --max-sandbox-*` lowers (or, for disk and pids, raises) it.
func DefaultMaxSandbox() sandbox.Limits {
	l := sandbox.Limits{MilliCPUs: int64(runtime.NumCPU()) * 1000, Pids: 32768, DiskBytes: 256 << 30}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64); err == nil {
					l.MemoryBytes = kb << 10
				}
			}
		}
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = 64 << 30
	}
	return l
}

// checkSandbox refuses a sandbox's requested limits above MaxSandbox,
// naming the maximum and the setting that raises it.
func (l Limits) checkSandbox(req sandbox.Limits) error {
	m := l.MaxSandbox
	switch {
	case req.MemoryBytes > m.MemoryBytes:
		return errdefs.InvalidArgumentf("memory limit %s is above the maximum of %s a sandbox may have here (max_sandbox_memory: amber up --max-sandbox-memory)", size(req.MemoryBytes), size(m.MemoryBytes))
	case req.MilliCPUs > m.MilliCPUs:
		return errdefs.InvalidArgumentf("cpu limit %dm is above the maximum of %dm a sandbox may have here (max_sandbox_cpus: amber up --max-sandbox-cpus)", req.MilliCPUs, m.MilliCPUs)
	case req.Pids > m.Pids:
		return errdefs.InvalidArgumentf("pids limit %d is above the maximum of %d a sandbox may have here (max_sandbox_pids: amber up --max-sandbox-pids)", req.Pids, m.Pids)
	case req.DiskBytes > m.DiskBytes:
		return errdefs.InvalidArgumentf("disk limit %s is above the maximum of %s a sandbox may have here (max_sandbox_disk: amber up --max-sandbox-disk)", size(req.DiskBytes), size(m.DiskBytes))
	}
	return nil
}

// MaxHeaderBytes bounds a request's headers; the daemon's http.Server sets
// it, and net/http answers 431 beyond it.
const MaxHeaderBytes = 64 << 10

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	pick := func(v *int64, def int64) {
		if *v <= 0 {
			*v = def
		}
	}
	pickInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	pick(&l.MaxBodyBytes, d.MaxBodyBytes)
	pick(&l.MaxUploadBytes, d.MaxUploadBytes)
	pickInt(&l.MaxArgs, d.MaxArgs)
	pickInt(&l.MaxEnv, d.MaxEnv)
	pickInt(&l.MaxCommandBytes, d.MaxCommandBytes)
	pickInt(&l.MaxExecsPerSandbox, d.MaxExecsPerSandbox)
	pickInt(&l.MaxStreamsPerTenant, d.MaxStreamsPerTenant)
	if l.BodyReadTimeout <= 0 {
		l.BodyReadTimeout = d.BodyReadTimeout
	}
	if m := l.MaxSandbox; m.MemoryBytes <= 0 || m.MilliCPUs <= 0 || m.Pids <= 0 || m.DiskBytes <= 0 {
		dm := DefaultMaxSandbox()
		pick(&l.MaxSandbox.MemoryBytes, dm.MemoryBytes)
		pick(&l.MaxSandbox.MilliCPUs, dm.MilliCPUs)
		pick(&l.MaxSandbox.Pids, dm.Pids)
		pick(&l.MaxSandbox.DiskBytes, dm.DiskBytes)
	}
	return l
}

// size prints n bytes for a person ("8 MiB").
func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// limitedBody bounds an upload. Past the limit reads fail with an error
// that says so, whatever the reader's consumer wraps it in; over records
// it for the handler.
type limitedBody struct {
	r     io.Reader
	left  int64
	limit int64
	what  string
	over  atomic.Bool
}

func newLimitedBody(r io.Reader, limit int64, what string) *limitedBody {
	return &limitedBody{r: r, left: limit, limit: limit, what: what}
}

func (b *limitedBody) err() error {
	return errdefs.TooLargef("%s is larger than the daemon's limit of %s (max_upload_bytes)", b.what, size(b.limit))
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the limit from a longer one.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.over.Store(true)
			return 0, b.err()
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// check returns the limit's error when the body went over it, else err.
func (b *limitedBody) check(err error) error {
	if b.over.Load() {
		return b.err()
	}
	return err
}

// limitBody bounds r's body to MaxBodyBytes (the middleware does it for
// every route but uploads; exec does it for a JSON body). Past the limit
// reads fail with *http.MaxBytesError, which readJSON turns into a 413.
func (s *Server) limitBody(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.limits.MaxBodyBytes)
}

// bodyError turns a JSON body's decoding error into the error the client
// sees: over the limit is 413 naming it, anything else 400.
func bodyError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errdefs.TooLargef("request body is larger than the daemon's limit of %s for JSON bodies (max_body_bytes)", size(mbe.Limit))
	}
	return errdefs.InvalidArgumentf("request body: %v", err)
}

// checkCommand applies the command limits to args and env (what names
// the command in the error: "exec", "process", "sandbox") and refuses
// what no execve could take: an argument with a NUL byte (C strings end
// there: the kernel would run another command than the one asked for),
// and env entries as checkEnv does.
func (l Limits) checkCommand(what string, args, env []string) error {
	if len(args) > l.MaxArgs {
		return errdefs.InvalidArgumentf("%s: %d arguments; the limit is %d (max_args)", what, len(args), l.MaxArgs)
	}
	for i, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.InvalidArgumentf("%s: argument %d holds a NUL byte, which no command line can carry", what, i)
		}
	}
	if err := l.checkEnv(what, env); err != nil {
		return err
	}
	n := 0
	for _, s := range args {
		n += len(s) + 1
	}
	for _, s := range env {
		n += len(s) + 1
	}
	if n > l.MaxCommandBytes {
		return errdefs.InvalidArgumentf("%s: arguments and environment are %s; the limit is %s (max_command_bytes)", what, size(int64(n)), size(int64(l.MaxCommandBytes)))
	}
	return nil
}

// checkEnv bounds env's entries (max_env) and refuses one that is not
// KEY=VALUE with a KEY of its own (no '=', an empty key) or holds a NUL
// byte: execve would pass it on garbled or cut, and the sandbox would see
// another environment than the one asked for.
func (l Limits) checkEnv(what string, env []string) error {
	if len(env) > l.MaxEnv {
		return errdefs.InvalidArgumentf("%s: %d environment entries; the limit is %d (max_env)", what, len(env), l.MaxEnv)
	}
	for i, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case strings.IndexByte(kv, 0) >= 0:
			return errdefs.InvalidArgumentf("%s: environment entry %d holds a NUL byte", what, i)
		case !ok:
			return errdefs.InvalidArgumentf("%s: environment entry %d (%.40q) is not KEY=VALUE", what, i, kv)
		case k == "":
			return errdefs.InvalidArgumentf("%s: environment entry %d (%.40q) has an empty name", what, i, kv)
		}
	}
	return nil
}

// checkCwd refuses a working directory with a NUL byte (no path holds
// one); whether it exists is the sandbox's to say.
func checkCwd(what, cwd string) error {
	if strings.IndexByte(cwd, 0) >= 0 {
		return errdefs.InvalidArgumentf("%s: cwd holds a NUL byte", what)
	}
	return nil
}

// execSlots counts the exec calls streaming into each sandbox.
type execSlots struct {
	mu sync.Mutex
	n  map[string]int
}

// take reserves a slot in sandbox id, or says why not; call the returned
// func when the exec ends.
func (e *execSlots) take(id string, limit int) (func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	if e.n[id] >= limit {
		return nil, errdefs.ResourceExhaustedf("sandbox %s already streams %d exec calls; the limit is %d at once (max_execs_per_sandbox): wait for one to end, or start background processes", id, e.n[id], limit)
	}
	e.n[id]++
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.n[id]--; e.n[id] == 0 {
			delete(e.n, id)
		}
	}, nil
}
