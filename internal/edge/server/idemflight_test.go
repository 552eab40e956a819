package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestIdempotentRetryWaitsForRunningCall: a client that has read the whole
// answer of a call may retry before the handler has returned and recorded
// it. That retry waits for the first call and gets its answer (replayed),
// not a 409 — this raced in CI (the TypeScript SDK's checkpoint retry).
// A retry whose first call fails runs again.
func TestIdempotentRetryWaitsForRunningCall(t *testing.T) {
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s := &Server{meta: m}
	c := &call{tenant: "default", lg: slog.New(slog.DiscardHandler)}

	written := make(chan struct{})
	release := make(chan struct{})
	runs := 0
	fail := false
	h := func(w http.ResponseWriter, r *http.Request, _ *call) error {
		runs++
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":"boom"}`)
			close(written)
			<-release
			return nil
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ckpt-1"}`)
		close(written) // the client has its answer now …
		<-release      // … and the handler has not returned yet
		return nil
	}
	serve := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/sandboxes/sbx-1/checkpoints", strings.NewReader(""))
		r.Header.Set(idemHeader, key)
		w := httptest.NewRecorder()
		if err := s.idempotent(w, r, c, h); err != nil {
			w.Code = 0
			io.WriteString(w, err.Error())
		}
		return w
	}

	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- serve("k1") }()
	<-written
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- serve("k1") }()
	select {
	case w := <-second:
		t.Fatalf("the retry did not wait for the running call: %d %s", w.Code, w.Body)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first call: %d %s", w.Code, w.Body)
	}
	w := <-second
	if w.Code != http.StatusCreated || w.Body.String() != `{"id":"ckpt-1"}` || w.Header().Get(idemReplayed) != "true" {
		t.Fatalf("retry: %d %q replayed=%q, want the first answer replayed", w.Code, w.Body, w.Header().Get(idemReplayed))
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}

	// A first call that fails: the waiting retry runs the call itself.
	written, release, fail = make(chan struct{}), make(chan struct{}), true
	go func() { first <- serve("k2") }()
	<-written
	go func() { second <- serve("k2") }()
	time.Sleep(100 * time.Millisecond)
	fail = false
	written = make(chan struct{}) // the retry's own run closes this one
	close(release)
	<-first
	if w := <-second; w.Code != http.StatusCreated || w.Header().Get(idemReplayed) != "" {
		t.Fatalf("retry after a failed first call: %d %q replayed=%q, want its own run", w.Code, w.Body, w.Header().Get(idemReplayed))
	}
	if runs != 3 {
		t.Fatalf("handler ran %d times, want 3", runs)
	}

	// The client reads the last frame and hangs up (its request's context
	// ends) before the handler returns: the answer is still recorded and
	// the retry gets it — the TypeScript SDK's checkpoint retry in CI.
	written, release = make(chan struct{}), make(chan struct{})
	ctx, hangUp := context.WithCancel(context.Background())
	go func() {
		r := httptest.NewRequest("POST", "/v1/sandboxes/sbx-1/checkpoints", strings.NewReader("")).WithContext(ctx)
		r.Header.Set(idemHeader, "k3")
		w := httptest.NewRecorder()
		if err := s.idempotent(w, r, c, h); err != nil {
			w.Code = 0
		}
		first <- w
	}()
	<-written
	hangUp()
	close(release)
	<-first
	if w := serve("k3"); w.Code != http.StatusCreated || w.Header().Get(idemReplayed) != "true" {
		t.Fatalf("retry after the client hung up: %d %q replayed=%q, want the first answer replayed", w.Code, w.Body, w.Header().Get(idemReplayed))
	}
	if runs != 4 {
		t.Fatalf("handler ran %d times, want 4", runs)
	}
}
