package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, c *call) error {
	ps, err := s.eng.Processes(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := api.ProcessList{Processes: []api.Process{}}
	for _, p := range ps {
		out.Processes = append(out.Processes, api.Process{PID: p.PID, PPID: p.PPID, Args: p.Args, StartTicks: p.StartTicks, State: p.State})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := s.decodeStartProcess(r)
	if err != nil {
		return err
	}
	pid, err := s.eng.StartProcess(r.Context(), c.tenant, r.PathValue("id"), sandbox.ExecSpec{Args: req.Args, Env: req.Env, Cwd: req.Cwd, OpenStdin: req.Stdin})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, api.StartProcessResponse{PID: pid})
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request, c *call) error {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errdefs.InvalidArgumentf("pid %q is not a process id", r.PathValue("pid"))
	}
	var req api.SignalRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	sig, err := ParseSignal(req.Signal)
	if err != nil {
		return err
	}
	if err := s.eng.Signal(r.Context(), c.tenant, r.PathValue("id"), pid, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// writeStdin sends the raw body to background process pid's stdin (one
// started with "stdin": true); ?close=true closes its stdin after the
// body, so the process reads end of file. The body is an upload, bounded
// by max_upload_bytes.
func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request, c *call) error {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errdefs.InvalidArgumentf("pid %q is not a process id", r.PathValue("pid"))
	}
	closeAfter, err := queryBool(r, "close")
	if err != nil {
		return err
	}
	body, err := s.upload(r, fmt.Sprintf("stdin of process %d", pid))
	if err != nil {
		return err
	}
	if err := body.check(s.eng.WriteStdin(r.Context(), c.tenant, r.PathValue("id"), pid, body, closeAfter)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// waitProcess waits until the process ends and answers with its
// ExitStatus. It holds the request for as long as the process runs, as
// one of the tenant's streams (streams.go); a client that gives up (closes
// the connection) or whose key is revoked ends the wait, never the
// process.
func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request, c *call) error {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errdefs.InvalidArgumentf("pid %q is not a process id", r.PathValue("pid"))
	}
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	st, err := s.eng.Wait(ctx, c.tenant, r.PathValue("id"), pid)
	if keyRevoked(ctx) {
		return errKeyRevoked
	}
	if err != nil && r.Context().Err() != nil {
		// The client hung up: nobody to answer, and not a failure.
		c.lg.InfoContext(r.Context(), "wait ended by the client", "pid", pid)
		return nil
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, Reason: st.Reason})
}

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM,
	"TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP,
	"WINCH": syscall.SIGWINCH,
}

// ParseSignal reads "TERM", "SIGTERM", "term" or "15".
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errdefs.InvalidArgumentf("signal %d is out of range 1..64", n)
		}
		return syscall.Signal(n), nil
	}
	if sig, ok := signals[strings.TrimPrefix(strings.ToUpper(s), "SIG")]; ok {
		return sig, nil
	}
	return 0, errdefs.InvalidArgumentf("unknown signal %q (use a name like TERM or a number)", s)
}

// processOutput streams a process's output as ndjson OutputFrames from
// ?offset= (see api.OutputFrame). Like waitProcess, it is one of the
// tenant's streams: a revoked key ends it, and a client that hangs up ends
// the stream, never the process. An error after the first frame is sent as
// a last "error" frame.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request, c *call) error {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errdefs.InvalidArgumentf("pid %q is not a process id", r.PathValue("pid"))
	}
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			return errdefs.InvalidArgumentf("offset %q is not a byte offset", v)
		}
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		if follow, err = strconv.ParseBool(v); err != nil {
			return errdefs.InvalidArgumentf("follow %q is not true or false", v)
		}
	}
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	fl := http.NewResponseController(w) // through the middleware's writer
	enc := json.NewEncoder(w)
	started := false
	err = s.eng.ProcessOutput(ctx, c.tenant, r.PathValue("id"), pid, offset, follow, func(f sandbox.OutputFrame) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		fr := api.OutputFrame{Stream: f.Kind, Offset: f.Offset, Data: f.Data, Lost: f.Lost}
		if f.Exit != nil {
			fr.Exit = &api.ExitStatus{Code: f.Exit.Code, Signal: f.Exit.Signal, TimedOut: f.Exit.TimedOut, Reason: f.Exit.Reason}
		}
		if err := enc.Encode(fr); err != nil {
			return err
		}
		_ = fl.Flush()
		return nil
	})
	if keyRevoked(ctx) {
		if !started {
			return errKeyRevoked
		}
		err = errKeyRevoked
	}
	if err != nil && r.Context().Err() != nil {
		return nil // the client hung up
	}
	if err == nil && !started {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		return nil
	}
	if err != nil && started {
		body := errBody(err)
		c.lg.WarnContext(r.Context(), "output stream failed", "pid", pid, "err", err)
		_ = enc.Encode(api.OutputFrame{Stream: "error", Error: &body})
		return nil
	}
	return err
}
