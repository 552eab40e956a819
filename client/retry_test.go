package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// TestRetrySafeCalls: with Retry set, a GET and a call with an
// Idempotency-Key (its body sent again whole) are tried again while the
// daemon answers 503; a call that is not safe to repeat, or any call
// without Retry, is sent once; other errors are not retried; a daemon that
// cannot be reached is retried until Retry runs out.
func TestRetrySafeCalls(t *testing.T) {
	var calls atomic.Int32
	var bodies []string
	failFirst := int32(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		if r.URL.Path == "/v1/sandboxes/sbx-missing" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"kind":"not found","message":"no sandbox"}}`)
			return
		}
		if n <= failFirst {
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"kind":"unavailable","message":"its node is down; retry"}}`)
			return
		}
		io.WriteString(w, `{"id":"sbx-1","state":"running"}`)
	}))
	defer srv.Close()
	ctx := context.Background()
	c, _ := New(srv.URL, "k")

	// Without Retry: one call, the 503 returned.
	if _, err := c.GetSandbox(ctx, "sbx-1"); !errors.Is(err, errdefs.ErrUnavailable) || calls.Load() != 1 {
		t.Fatalf("no retry: %v after %d calls", err, calls.Load())
	}
	c.Retry = 10 * time.Second
	calls.Store(0)
	if sb, err := c.GetSandbox(ctx, "sbx-1"); err != nil || sb.ID != "sbx-1" || calls.Load() != 3 {
		t.Fatalf("GET with retry: %+v %v after %d calls, want success at the 3rd", sb, err, calls.Load())
	}
	// Not found is an answer, not retried.
	calls.Store(0)
	if _, err := c.GetSandbox(ctx, "sbx-missing"); !errdefs.IsNotFound(err) || calls.Load() != 1 {
		t.Fatalf("404: %v after %d calls", err, calls.Load())
	}
	// A POST without a key is not safe to repeat.
	calls.Store(0)
	if _, err := c.KillSandbox(ctx, "sbx-1"); !errors.Is(err, errdefs.ErrUnavailable) || calls.Load() != 1 {
		t.Fatalf("POST without a key: %v after %d calls, want one", err, calls.Load())
	}
	// With an Idempotency-Key, the same body each time.
	calls.Store(0)
	bodies = nil
	req, _ := c.request(ctx, "POST", "/v1/sandboxes", nil, strings.NewReader(`{"template":"minimal"}`), "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := c.send(req)
	if err != nil || calls.Load() != 3 {
		t.Fatalf("POST with a key: %v after %d calls", err, calls.Load())
	}
	resp.Body.Close()
	for _, b := range bodies {
		if b != `{"template":"minimal"}` {
			t.Fatalf("bodies sent: %q", bodies)
		}
	}

	// Nobody listening: retried until Retry runs out, then the error.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	d, _ := New(addr, "k")
	d.Retry = 1500 * time.Millisecond
	start := time.Now()
	if _, err := d.GetSandbox(ctx, "sbx-1"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unreachable: %v", err)
	}
	if el := time.Since(start); el < time.Second || el > 5*time.Second {
		t.Fatalf("unreachable: gave up after %s, want about Retry (1.5 s)", el)
	}
}
