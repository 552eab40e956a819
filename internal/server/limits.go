package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/amber-run/amber/core/errdefs"
)

// Limits bound what one request may ask of the daemon, so that a client
// (or a bug in one) cannot exhaust its memory or goroutines. Each refusal
// names the limit: 413 for sizes, 400 for counts in a request, 429 for
// calls at once. Zero fields take the defaults (DefaultLimits).
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
}

// DefaultLimits are the limits of a Server whose Options leave them zero.
var DefaultLimits = Limits{
	MaxBodyBytes:       8 << 20,
	MaxUploadBytes:     1 << 30,
	MaxArgs:            4096,
	MaxEnv:             4096,
	MaxCommandBytes:    1 << 20,
	MaxExecsPerSandbox: 64,
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
// the command in the error: "exec", "process", "sandbox").
func (l Limits) checkCommand(what string, args, env []string) error {
	if len(args) > l.MaxArgs {
		return errdefs.InvalidArgumentf("%s: %d arguments; the limit is %d (max_args)", what, len(args), l.MaxArgs)
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

func (l Limits) checkEnv(what string, env []string) error {
	if len(env) > l.MaxEnv {
		return errdefs.InvalidArgumentf("%s: %d environment entries; the limit is %d (max_env)", what, len(env), l.MaxEnv)
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
