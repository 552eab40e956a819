package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// syncBuf is a log sink safe for the server's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// brokenServer is a server whose metadata store was closed under it (a
// store that fails: every call that reads it is an internal error whose
// text names the store), logging into a buffer.
func brokenServer(t *testing.T, eng *engine.Engine) (*httptest.Server, string, *syncBuf) {
	t.Helper()
	dir := t.TempDir()
	m, err := sqlmeta.Open(filepath.Join(dir, "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := "amber_test_key_internal_errors"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	logs := &syncBuf{}
	ts := httptest.NewServer(server.New(server.Options{Meta: m, Engine: eng, Logger: slog.New(slog.NewTextHandler(logs, nil))}))
	t.Cleanup(ts.Close)
	return ts, dir, logs
}

func get(t *testing.T, url, token string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// TestInternalErrorHidesDetail: a call that fails inside (the metadata
// store is gone) answers 500 {"error":{"kind":"internal","message":
// "internal error","request_id":…}}: nothing of the store's path or error
// text; the detail is in the log under that request id. Errors of every
// other kind keep their messages.
func TestInternalErrorHidesDetail(t *testing.T) {
	ts, dir, logs := brokenServer(t, nil)
	code, body, hdr := get(t, ts.URL+"/v1/sandboxes", "amber_test_key_internal_errors")
	var e struct {
		Error map[string]string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("%d %s: %v", code, body, err)
	}
	rid := hdr.Get("X-Request-Id")
	if code != 500 || e.Error["kind"] != "internal" || e.Error["message"] != "internal error" || rid == "" || e.Error["request_id"] != rid {
		t.Fatalf("500 answers %d %s (X-Request-Id %q); want kind internal, message \"internal error\", request_id %q", code, body, rid, rid)
	}
	for _, leak := range []string{dir, "meta.db", "sql", "closed"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("the answer %s names %q", body, leak)
		}
	}
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "request_id="+rid) && strings.Contains(l, "err=") {
			line = l
		}
	}
	if !strings.Contains(line, "closed") {
		t.Errorf("the detail is not logged under request %s:\n%s", rid, logs.String())
	}
	// Other kinds keep their messages.
	code, body, _ = get(t, ts.URL+"/v1/nope", "")
	if code != 404 || !strings.Contains(string(body), "no route GET /v1/nope") {
		t.Errorf("a 404: %d %s", code, body)
	}
	code, body, _ = get(t, ts.URL+"/v1/sandboxes", "")
	if code != 401 || !strings.Contains(string(body), "missing Authorization") {
		t.Errorf("a 401: %d %s", code, body)
	}
}

// TestReadyzRevealsNothing: /readyz of a daemon whose metadata store
// fails says "not ready" and nothing else (no store, path, version or
// error text); the reason is logged. A ready daemon says ready, and the
// operator's key gets the reason (here: no engine).
func TestReadyzRevealsNothing(t *testing.T) {
	ts, dir, logs := brokenServer(t, &engine.Engine{})
	code, body, _ := get(t, ts.URL+"/readyz", "")
	if code != 503 || !strings.Contains(string(body), `"not ready`) {
		t.Fatalf("readyz of a broken daemon: %d %s", code, body)
	}
	for _, leak := range []string{dir, "meta", "sql", "closed", "store", "engine", "log"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("readyz answers %s: it names %q", body, leak)
		}
	}
	if !strings.Contains(logs.String(), "closed") {
		t.Errorf("the reason is not logged:\n%s", logs.String())
	}

	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := "amber_test_key_readyz_operator"
	m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes})
	m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "reader", Hash: meta.HashKey(key + "r"), Scopes: []meta.Scope{meta.ScopeRead}})
	ts2 := httptest.NewServer(server.New(server.Options{Meta: m}))
	defer ts2.Close()
	if code, body, _ := get(t, ts2.URL+"/readyz", ""); code != 503 || strings.Contains(string(body), "engine") {
		t.Errorf("readyz without an engine, anonymous: %d %s", code, body)
	}
	if code, body, _ := get(t, ts2.URL+"/readyz", key+"r"); code != 503 || strings.Contains(string(body), "engine") {
		t.Errorf("readyz without an engine, a read key: %d %s", code, body)
	}
	if code, body, _ := get(t, ts2.URL+"/readyz", key); code != 503 || !strings.Contains(string(body), "no engine") {
		t.Errorf("readyz without an engine, the operator: %d %s", code, body)
	}
}
