package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/sandbox"
)

// frameWriter writes exec frames as newline-delimited JSON, flushing each,
// from the stdout and stderr copiers at once.
type frameWriter struct {
	mu  sync.Mutex
	enc *json.Encoder
	rc  *http.ResponseController
	err error
}

func (f *frameWriter) write(fr api.ExecFrame) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if f.err = f.enc.Encode(fr); f.err == nil {
		f.err = f.rc.Flush()
	}
	return f.err
}

type streamWriter struct {
	f    *frameWriter
	name string
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.f.write(api.ExecFrame{Stream: s.name, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// parseExec reads an exec request: a JSON ExecRequest body, or the command
// in query parameters and the raw body as streamed stdin.
func parseExec(r *http.Request) (req api.ExecRequest, stdin io.Reader, streamed bool, err error) {
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/json") {
		if err := readJSON(r, &req); err != nil {
			return req, nil, false, err
		}
		return req, bytes.NewReader(req.Stdin), false, nil
	}
	q := r.URL.Query()
	req.Args, req.Cmd, req.Env, req.Cwd = q["arg"], q.Get("cmd"), q["env"], q.Get("cwd")
	if req.TTY, err = queryBool(r, "tty"); err != nil {
		return req, nil, false, err
	}
	if req.TimeoutMS, err = queryInt(r, "timeout_ms", 0); err != nil {
		return req, nil, false, err
	}
	return req, r.Body, true, nil
}

// exec runs a command and streams its output as ExecFrames, ending with an
// exit (or error) frame. Once the 200 is out, failures travel in that last
// frame. It is one of the tenant's streams: a revoked key ends the command
// and the stream with an error frame (streams.go).
func (s *Server) exec(w http.ResponseWriter, r *http.Request, c *call) error {
	req, stdin, streamed, err := s.decodeExec(w, r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	// An idle sandbox wakes before the 200 goes out (engine.Wake), so that
	// a sandbox that cannot run is still a plain 412, not an error frame.
	if _, err := s.eng.Wake(r.Context(), c.tenant, id); err != nil {
		return err
	}
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	release, err := s.execs.take(id, s.limits.MaxExecsPerSandbox)
	if err != nil {
		return err
	}
	defer release()
	rc := http.NewResponseController(w)
	if streamed {
		// Read stdin while writing output (HTTP/1.1 full duplex).
		if err := rc.EnableFullDuplex(); err != nil {
			c.lg.DebugContext(r.Context(), "full duplex unavailable", "err", err)
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{enc: json.NewEncoder(w), rc: rc}
	fw.rc.Flush()
	start := time.Now()
	st, err := s.eng.Exec(ctx, c.tenant, id, sandbox.ExecSpec{
		Args: req.Args, Env: req.Env, Cwd: req.Cwd, TTY: req.TTY,
		Timeout: time.Duration(req.TimeoutMS) * time.Millisecond,
		Stdin:   stdin, Stdout: streamWriter{fw, "stdout"}, Stderr: streamWriter{fw, "stderr"},
		// The command's sandbox pid comes first: with it a client whose
		// stream broke re-attaches (GET …/processes/{pid}/output).
		Started: func(pid int) { _ = fw.write(api.ExecFrame{PID: pid}) },
	})
	if keyRevoked(ctx) {
		err = errKeyRevoked // the command was ended with the stream
	}
	if err != nil {
		eb := errBody(err)
		c.lg.WarnContext(r.Context(), "exec failed", "err", err)
		return fw.write(api.ExecFrame{Error: &eb})
	}
	c.lg.InfoContext(r.Context(), "exec done", "args0", req.Args[0], "code", st.Code, "took", time.Since(start).Round(time.Millisecond))
	return fw.write(api.ExecFrame{Exit: &api.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, Reason: st.Reason}})
}
