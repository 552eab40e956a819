package server

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpProgress sends a tool call's progress notifications (MCP
// notifications/progress) when its request asked for them with
// _meta.progressToken. In a session they travel on the call's SSE answer
// as it runs; a sessionless call's JSON answer has no room for them, and
// they are dropped. Progress is a count that grows by one with each
// notification (the spec asks only that it grow; a command's length is
// unknown, so there is no total); the message says what happened: a
// command's new output (its last mcpProgressText bytes, stdout and stderr
// as they came), else every mcpProgressBeat that it still runs.
//
// A nil *mcpProgress (no token) does nothing, so the tools call it
// unconditionally.
type mcpProgress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	tok   any
	start time.Time
	what  string

	mu      sync.Mutex
	n       int
	pending []byte // output not yet sent
	last    time.Time

	stop, done chan struct{}
}

const (
	mcpProgressEvery = 250 * time.Millisecond // how often new output is sent
	mcpProgressBeat  = 2 * time.Second        // a notification at least this often
	mcpProgressText  = 1 << 10
)

// startProgress returns the progress of req (nil when it asked for none),
// having sent its first notification, "<what> started".
func startProgress(ctx context.Context, req *mcp.CallToolRequest, what string) *mcpProgress {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return nil
	}
	p := &mcpProgress{ctx: ctx, ss: req.Session, tok: tok, start: time.Now(), what: what,
		stop: make(chan struct{}), done: make(chan struct{})}
	p.note(what + " started")
	go p.loop()
	return p
}

func (p *mcpProgress) loop() {
	defer close(p.done)
	t := time.NewTicker(mcpProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		out, quiet := p.pending, time.Since(p.last) >= mcpProgressBeat
		p.pending = nil
		p.mu.Unlock()
		switch {
		case len(out) > 0:
			p.note(string(validTail(out)))
		case quiet:
			p.note(fmt.Sprintf("%s running (%s)", p.what, time.Since(p.start).Round(time.Second)))
		}
	}
}

// Write takes a command's output: it is sent with the next notification.
func (p *mcpProgress) Write(b []byte) (int, error) {
	if p == nil {
		return len(b), nil
	}
	p.mu.Lock()
	p.pending = append(p.pending, b...)
	if len(p.pending) > mcpProgressText {
		p.pending = p.pending[len(p.pending)-mcpProgressText:]
	}
	p.mu.Unlock()
	return len(b), nil
}

// note sends one notification now. Notifications are told apart by their
// count, which note alone advances (in the order they are sent).
func (p *mcpProgress) note(msg string) {
	if p == nil || p.ctx.Err() != nil {
		return // a cancelled call's client knows no more of its token
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	p.last = time.Now()
	// An error (the client left, no stream to send on) leaves the call
	// itself as it is.
	_ = p.ss.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.tok, Progress: float64(p.n), Message: msg})
}

// end stops the notifications after the output still pending and a last
// one, msg: none is sent after the call's answer.
func (p *mcpProgress) end(msg string) {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	out := p.pending
	p.pending = nil
	p.mu.Unlock()
	if len(out) > 0 {
		p.note(string(validTail(out)))
	}
	p.note(msg)
}

// validTail drops the bytes of a character cut at b's start (the tail of
// a longer output), and whatever else is not UTF-8.
func validTail(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	if utf8.Valid(b) {
		return b
	}
	return []byte(string([]rune(string(b)))) // invalid bytes become U+FFFD
}
