package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
)

// timedWriter records when the first write happened.
type timedWriter struct {
	mu    sync.Mutex
	first time.Time
	data  []byte
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	w.data = append(w.data, p...)
	return len(p), nil
}

// TestExecStreamsOutput: output reaches the client while the command runs,
// not when it ends.
func TestExecStreamsOutput(t *testing.T) {
	c, _, _ := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	var w timedWriter
	start := time.Now()
	st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "echo first; sleep 3; echo second"}}, nil, &w, nil)
	end := time.Now()
	if err != nil || st.Code != 0 || string(w.data) != "first\nsecond\n" {
		t.Fatalf("exec: %+v %v %q", st, err, w.data)
	}
	if end.Sub(w.first) < 2*time.Second {
		t.Fatalf("first output arrived %v after the start and %v before the end: not streamed", w.first.Sub(start), end.Sub(w.first))
	}
}

// TestEventsFollow: ?follow=true delivers events as they are appended.
func TestEventsFollow(t *testing.T) {
	c, _, url := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(fctx, "GET", url+"/v1/sandboxes/"+sb.ID+"/events?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("follow: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	next := func() api.Event {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("stream ended: %v", sc.Err())
		}
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if a, b := next(), next(); a.Type != "sandbox.created" || b.Type != "sandbox.started" || b.Seq != 2 {
		t.Fatalf("first events: %+v %+v", a, b)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.Type != "sandbox.destroyed" || ev.Seq != 3 {
		t.Fatalf("followed event: %+v", ev)
	}
}
