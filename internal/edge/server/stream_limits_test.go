package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// openFollow opens GET /v1/sandboxes/{id}/events?follow=true with key and
// returns the response (the caller closes its body).
func openFollow(t *testing.T, ctx context.Context, base, key, id string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/sandboxes/"+id+"/events?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tenantKey makes tenant id and a key of every scope for it, over the API.
func tenantKey(t *testing.T, ctx context.Context, op *client.Client, id, name string) string {
	t.Helper()
	if _, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: id}); err != nil && !strings.Contains(err.Error(), "exists") {
		t.Fatal(err)
	}
	k, err := op.CreateKey(ctx, id, api.CreateKeyRequest{Name: name, Scopes: []string{"read", "write", "admin"}})
	if err != nil {
		t.Fatal(err)
	}
	return k.Key
}

// TestLimitsAboveMaximum: a sandbox asking for more than a node has is a
// 400 that names the maximum (the daemon's default maxima are the node's
// memory and CPUs), not a sandbox that cannot run or a host overcommitted.
func TestLimitsAboveMaximum(t *testing.T) {
	_, _, base := newAPI(t)
	for _, c := range []struct{ limits, says string }{
		{`{"memory_bytes":1125899906842624}`, "max_sandbox_memory"},
		{`{"millicpus":100000000}`, "max_sandbox_cpus"},
		{`{"pids":100000000}`, "max_sandbox_pids"},
		{`{"disk_bytes":1125899906842624}`, "max_sandbox_disk"},
	} {
		code, e := sendRaw(t, "POST", base+"/v1/sandboxes", strings.NewReader(`{"template":"minimal","limits":`+c.limits+`}`), map[string]string{"Content-Type": "application/json"})
		if code != 400 || !strings.Contains(e.Message, c.says) || !strings.Contains(e.Message, "maximum of") {
			t.Errorf("create with limits %s = %d %q, want 400 naming the maximum (%s)", c.limits, code, e.Message, c.says)
		}
	}
}

// TestStreamCapPerTenant: a tenant holds at most 128 streams at once (the
// default max_streams_per_tenant); the next is a 429 naming the cap, while
// another tenant still opens its own, and closing one frees a place.
func TestStreamCapPerTenant(t *testing.T) {
	const cap = 128
	op, _, base := newAPI(t)
	ctx := ctxT(t)
	keyA := tenantKey(t, ctx, op, "acme", "owner")
	keyB := tenantKey(t, ctx, op, "globex", "owner")
	a, _ := client.New(base, keyA)
	b, _ := client.New(base, keyB)
	sbA, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := b.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var open []*http.Response
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	for i := range cap {
		r := openFollow(t, sctx, base, keyA, sbA.ID)
		if r.StatusCode != 200 {
			b, _ := io.ReadAll(r.Body)
			t.Fatalf("stream %d of acme = %d %s", i+1, r.StatusCode, b)
		}
		open = append(open, r)
	}
	over := openFollow(t, sctx, base, keyA, sbA.ID)
	body, _ := io.ReadAll(over.Body)
	over.Body.Close()
	if over.StatusCode != http.StatusTooManyRequests || !bytes.Contains(body, []byte("max_streams_per_tenant")) || !bytes.Contains(body, []byte("128")) {
		t.Fatalf("stream %d of acme = %d %s, want 429 naming max_streams_per_tenant and its 128", cap+1, over.StatusCode, body)
	}
	// Another way to stream counts against the same cap.
	if _, err := a.Exec(ctx, sbA.ID, api.ExecRequest{Args: []string{"true"}}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "max_streams_per_tenant") {
		t.Errorf("exec of acme at its cap: %v, want the cap's refusal", err)
	}
	// Another tenant is not held back by acme's streams.
	rb := openFollow(t, sctx, base, keyB, sbB.ID)
	if rb.StatusCode != 200 {
		t.Errorf("globex's stream while acme is at its cap = %d", rb.StatusCode)
	}
	rb.Body.Close()
	// Closing one of acme's frees a place (the server sees the hang-up).
	open[0].Body.Close()
	open = open[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := openFollow(t, sctx, base, keyA, sbA.ID)
		if r.StatusCode == 200 {
			open = append(open, r)
			break
		}
		r.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("after closing a stream, acme's next = %d", r.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStreamEndsOnKeyRevoke: the streams a key opened — followed events,
// an exec, a process wait, a terminal — end within a few seconds of its revocation,
// each with an error that says why where its format has room for one;
// the streams of another key of the same tenant go on.
func TestStreamEndsOnKeyRevoke(t *testing.T) {
	op, _, base := newAPI(t)
	ctx := ctxT(t)
	key := tenantKey(t, ctx, op, "acme", "doomed")
	other := tenantKey(t, ctx, op, "acme", "kept")
	a, _ := client.New(base, key)
	sb, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := a.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	follow := openFollow(t, sctx, base, key, sb.ID)
	defer follow.Body.Close()
	kept := openFollow(t, sctx, base, other, sb.ID)
	defer kept.Body.Close()
	if follow.StatusCode != 200 || kept.StatusCode != 200 {
		t.Fatalf("follow = %d, %d", follow.StatusCode, kept.StatusCode)
	}
	type ended struct {
		what, last string
		at         time.Time
	}
	done := make(chan ended, 4)
	code, tk := postTicket(t, base, key, sb.ID)
	if code != 201 {
		t.Fatalf("terminal ticket: %d", code)
	}
	term, _, err := websocket.Dial(sctx, wsURL(base, tk.Path), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer term.CloseNow()
	go func() {
		last := ""
		for {
			typ, b, err := term.Read(sctx)
			if err != nil {
				break
			}
			if typ == websocket.MessageText {
				last = string(b)
			}
		}
		done <- ended{"terminal", last, time.Now()}
	}()
	go func() {
		sc := bufio.NewScanner(follow.Body)
		last := ""
		for sc.Scan() {
			last = sc.Text()
		}
		done <- ended{"events", last, time.Now()}
	}()
	go func() {
		_, err := a.Exec(sctx, sb.ID, api.ExecRequest{Args: []string{"sleep", "600"}}, nil, io.Discard, io.Discard)
		msg := "<nil>"
		if err != nil {
			msg = err.Error()
		}
		done <- ended{"exec", msg, time.Now()}
	}()
	go func() {
		_, err := a.Wait(sctx, sb.ID, pid)
		msg := "<nil>"
		if err != nil {
			msg = err.Error()
		}
		done <- ended{"wait", msg, time.Now()}
	}()
	time.Sleep(2 * time.Second) // all four are open
	select {
	case e := <-done:
		t.Fatalf("%s ended before the revocation: %s", e.what, e.last)
	default:
	}
	revoked := time.Now()
	if err := op.RevokeKey(ctx, "acme", "doomed"); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		select {
		case e := <-done:
			took := e.at.Sub(revoked)
			t.Logf("%s ended %v after the revocation: %s", e.what, took.Round(time.Millisecond), e.last)
			if took > 6*time.Second {
				t.Errorf("%s ended %v after the revocation, want within a few seconds", e.what, took)
			}
			if !strings.Contains(e.last, "revoked") {
				t.Errorf("%s ended with %q, want an error naming the revocation", e.what, e.last)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("a stream of the revoked key is still open 10s after the revocation")
		}
	}
	// The other key's stream is still open: an event still reaches it.
	if err := a.Signal(ctx, sb.ID, pid, "KILL"); err == nil {
		t.Fatalf("the revoked key still works")
	}
	ka, _ := client.New(base, other)
	if err := ka.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(kept.Body)
	for sc.Scan() {
		var ev api.Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Type == "sandbox.destroyed" {
			return
		}
	}
	t.Fatalf("the other key's stream ended: %v", sc.Err())
}

// TestSessionStreamEndsOnKeyRevoke: a session's SSE stream opened with a
// key ends within a few seconds of the key's revocation.
func TestSessionStreamEndsOnKeyRevoke(t *testing.T) {
	cl, urlKey, _ := sessionServer(t)
	base, _, _ := strings.Cut(urlKey, "|")
	ctx := ctxT(t)
	k, err := cl.CreateKey(ctx, "default", api.CreateKeyRequest{Name: "doomed", Scopes: []string{"read", "write"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted", "script": []any{map[string]any{"text": "hi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, "GET", base+"/v1/sessions/"+s.ID+"/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+k.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("session stream = %d", resp.StatusCode)
	}
	ended := make(chan time.Time, 1)
	go func() {
		io.Copy(io.Discard, resp.Body)
		ended <- time.Now()
	}()
	time.Sleep(500 * time.Millisecond)
	revoked := time.Now()
	if err := cl.RevokeKey(ctx, "default", "doomed"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ended:
		t.Logf("session stream ended %v after the revocation", at.Sub(revoked).Round(time.Millisecond))
		if at.Sub(revoked) > 6*time.Second {
			t.Errorf("session stream ended %v after the revocation, want within a few seconds", at.Sub(revoked))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the session stream of a revoked key is still open 10s after the revocation")
	}
}
