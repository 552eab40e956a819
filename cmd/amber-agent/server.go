package main

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/amber-run/amber/lib/agentproto"
)

// routes is the agent's API (see lib/agentproto).
func (a *agent) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, a.health(r.Context()))
	})
	mux.HandleFunc("POST /v1/processes", a.startProcess)
	mux.HandleFunc("GET /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		ps, err := listProcesses()
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, ps)
	})
	mux.HandleFunc("GET /v1/census", func(w http.ResponseWriter, r *http.Request) {
		c, err := census()
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, c)
	})
	mux.HandleFunc("GET /v1/processes/{pid}/output", a.output)
	mux.HandleFunc("POST /v1/processes/{pid}/stdin", a.stdin)
	mux.HandleFunc("POST /v1/processes/{pid}/signal", a.signal)
	mux.HandleFunc("POST /v1/processes/{pid}/resize", a.resize)
	mux.HandleFunc("GET /v1/processes/{pid}/wait", a.wait)
	mux.HandleFunc("GET /v1/watch", a.watch)
	a.fileRoutes(mux)
	return a.authorized(mux)
}

// authorized refuses a request without the sandbox's agent token.
func (a *agent) authorized(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(agentproto.TokenHeader)
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
			w.WriteHeader(http.StatusUnauthorized)
			writeJSON(w, agentproto.Error{Code: "denied", Message: "no or wrong agent token"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	code, status := "internal", http.StatusInternalServerError
	switch {
	case errors.Is(err, errNotFound):
		code, status = "not_found", http.StatusNotFound
	case errors.Is(err, errInvalid):
		code, status = "invalid", http.StatusBadRequest
	case errors.Is(err, errNoProgram):
		code, status = "no_program", http.StatusUnprocessableEntity
	case errors.Is(err, errNoExec):
		code, status = "not_executable", http.StatusUnprocessableEntity
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(agentproto.Error{Code: code, Message: err.Error()})
}

func decode(r *http.Request, v any) error {
	if err := json.NewDecoder(io.LimitReader(r.Body, agentproto.MaxJSON)).Decode(v); err != nil {
		return errors.Join(errInvalid, err)
	}
	return nil
}

func (a *agent) proc(w http.ResponseWriter, r *http.Request) (*proc, bool) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		writeErr(w, errors.Join(errInvalid, errors.New("bad pid")))
		return nil, false
	}
	p, err := a.procs.get(pid)
	if err != nil {
		writeErr(w, err)
		return nil, false
	}
	return p, true
}

func (a *agent) startProcess(w http.ResponseWriter, r *http.Request) {
	var s agentproto.Start
	if err := decode(r, &s); err != nil {
		writeErr(w, err)
		return
	}
	if len(s.Key) > 128 {
		writeErr(w, errors.Join(errInvalid, errors.New("key longer than 128 bytes")))
		return
	}
	p, ok := a.procs.started(s.Key) // asked again: the one it started
	if !ok {
		var err error
		if p, err = a.procs.start(s); err != nil {
			writeErr(w, err)
			return
		}
	}
	if r.URL.Query().Get("attach") == "1" {
		w.Header().Set(agentproto.PIDHeader, strconv.Itoa(p.pid))
		a.stream(w, r, p, 0, true)
		return
	}
	writeJSON(w, agentproto.Started{PID: p.pid})
}

// output streams a process's output from ?offset= (0 by default); with
// follow=1 it goes on until the process has ended, then sends the exit
// frame. An offset before the ring's first byte gets a lost frame first; an
// offset beyond its end (the client saw output of a later cut than the one
// the sandbox was restored to) gets a rewound frame.
func (a *agent) output(w http.ResponseWriter, r *http.Request) {
	p, ok := a.proc(w, r)
	if !ok {
		return
	}
	off, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if r.URL.Query().Get("offset") == "" {
		off, err = 0, nil
	}
	if err != nil || off < 0 {
		writeErr(w, errors.Join(errInvalid, errors.New("bad offset")))
		return
	}
	a.stream(w, r, p, off, r.URL.Query().Get("follow") == "1")
}

// stream writes p's output from off on (see output).
func (a *agent) stream(w http.ResponseWriter, r *http.Request, p *proc, off int64, follow bool) {
	p.mu.Lock()
	p.followers++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.followers--
		if p.followers == 0 {
			p.detached = time.Now()
		}
		p.notify()
		p.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	p.mu.Lock()
	if off > p.ring.end {
		off = p.ring.end
		p.mu.Unlock()
		if agentproto.WriteFrame(w, agentproto.Frame{Kind: agentproto.Rewound, Offset: off}) != nil {
			return
		}
		p.mu.Lock()
	}
	for {
		var frames []agentproto.Frame
		if start := p.ring.start(); off < start { // fell out while we were away
			frames = append(frames, agentproto.LostFrame(start, start-off))
			off = start
		}
		more, next := p.ring.from(off, 1<<20)
		frames = append(frames, more...)
		done := p.done()
		var exit agentproto.Exit
		if done {
			exit = *p.exit
		}
		changed := p.changed
		p.mu.Unlock()
		for _, f := range frames {
			if agentproto.WriteFrame(w, f) != nil {
				return
			}
		}
		off = next
		if len(frames) > 0 {
			if fl != nil {
				fl.Flush()
			}
			p.mu.Lock()
			if off > p.read {
				p.read = off // a held process may write on
				p.notify()
			}
			p.mu.Unlock()
		}
		if len(frames) == 0 && (done || !follow) {
			if done {
				_ = agentproto.WriteFrame(w, agentproto.ExitFrame(off, exit))
			}
			if fl != nil {
				fl.Flush()
			}
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if len(frames) == 0 {
			select {
			case <-changed:
			case <-r.Context().Done():
				return
			}
		}
		p.mu.Lock()
	}
}

func (a *agent) stdin(w http.ResponseWriter, r *http.Request) {
	p, ok := a.proc(w, r)
	if !ok {
		return
	}
	if err := p.writeStdin(r.Body, r.URL.Query().Get("close") == "1"); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// signal signals a process of the sandbox: one the agent started, or any
// other (the agent is the sandbox's root; it refuses to signal itself).
func (a *agent) signal(w http.ResponseWriter, r *http.Request) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		writeErr(w, errors.Join(errInvalid, errors.New("bad pid")))
		return
	}
	if pid == os.Getpid() {
		writeErr(w, errors.Join(errInvalid, errors.New("that is the sandbox's agent")))
		return
	}
	p, _ := a.procs.get(pid)
	if p == nil {
		p = &proc{pid: pid, changed: make(chan struct{})}
	}
	var s agentproto.Signal
	if err := decode(r, &s); err != nil {
		writeErr(w, err)
		return
	}
	if s.Signal < 0 || s.Signal > 64 {
		writeErr(w, errors.Join(errInvalid, errors.New("bad signal")))
		return
	}
	target := p.pid
	if s.Group {
		target = -p.pid
	}
	// A process that ended is reaped, its PID gone: ESRCH is the answer
	// (a zombie not yet reaped still takes a signal; a group may outlive
	// its leader).
	if err := syscall.Kill(target, syscall.Signal(s.Signal)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			writeErr(w, errors.Join(errNotFound, err))
			return
		}
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *agent) resize(w http.ResponseWriter, r *http.Request) {
	p, ok := a.proc(w, r)
	if !ok {
		return
	}
	var s agentproto.Resize
	if err := decode(r, &s); err != nil {
		writeErr(w, err)
		return
	}
	if p.tty == nil {
		writeErr(w, errors.Join(errInvalid, errors.New("the process has no terminal")))
		return
	}
	if err := setSize(p.tty, s.Rows, s.Cols); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wait answers once the process has ended.
func (a *agent) wait(w http.ResponseWriter, r *http.Request) {
	p, ok := a.proc(w, r)
	if !ok {
		return
	}
	for {
		p.mu.Lock()
		e, fin, changed := p.exit, p.finished, p.changed
		p.mu.Unlock()
		if e != nil && fin {
			writeJSON(w, e)
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-time.After(time.Minute):
		}
	}
}
