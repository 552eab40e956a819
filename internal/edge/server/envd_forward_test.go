package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestEnvdForwardsToTheOwner: an envd request for a sandbox of another
// node goes there, with the SDK's headers and the forwarded-by mark; one
// already forwarded is served here.
func TestEnvdForwardsToTheOwner(t *testing.T) {
	var got struct {
		sync.Mutex
		path, sandbox, token, by string
	}
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Lock()
		got.path, got.sandbox, got.token, got.by = r.URL.Path, r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("X-Access-Token"), r.Header.Get(forwardedHeader)
		got.Unlock()
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(owner.Close)
	u, _ := url.Parse(owner.URL)
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rt := &fakeRouter{owner: u.Host}
	ts := httptest.NewServer(New(Options{Meta: m, Router: rt, Envd: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(ts.Close)

	req, _ := http.NewRequest("POST", ts.URL+"/process.Process/List", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", "sbx-elsewhere")
	req.Header.Set("X-Access-Token", "amber_some_key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got.Lock()
	defer got.Unlock()
	if resp.StatusCode != http.StatusTeapot || got.path != "/process.Process/List" || got.sandbox != "sbx-elsewhere" || got.token != "amber_some_key" || got.by != "node-here" {
		t.Fatalf("forwarded: %d; the owner saw %s sandbox %q token %q by %q", resp.StatusCode, got.path, got.sandbox, got.token, got.by)
	}
	if len(rt.asked) != 1 || rt.asked[0] != "sbx-elsewhere" {
		t.Fatalf("router asked %v", rt.asked)
	}
}
