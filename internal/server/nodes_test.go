package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/meta"
)

// fakeRouter says every sandbox runs at owner (or fails with err) and
// records the sandboxes it was asked about.
type fakeRouter struct {
	owner string
	err   error
	mu    sync.Mutex
	asked []string
}

func (f *fakeRouter) Owner(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	f.asked = append(f.asked, id)
	f.mu.Unlock()
	return f.owner, f.err
}

func (f *fakeRouter) Self() string { return "node-here" }

// TestForwardToTheOwner: a call into a sandbox of another node is proxied
// there once, with its key, body and the forwarded-by header; a call that
// was already forwarded, or one every node answers from the shared stores,
// is not (the router is not even asked); a sandbox whose node is down
// answers 503.
func TestForwardToTheOwner(t *testing.T) {
	var got struct {
		sync.Mutex
		method, path, auth, by, body string
	}
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Lock()
		got.method, got.path, got.auth, got.by, got.body = r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get(forwardedHeader), string(b)
		got.Unlock()
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "from the owner")
	}))
	t.Cleanup(owner.Close)
	u, _ := url.Parse(owner.URL)

	m, err := meta.Open(filepath.Join(t.TempDir(), "meta.db"), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	key := "amber_test_forward_key_0123456789abcdef"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	rt := &fakeRouter{owner: u.Host}
	// No engine: the calls answered here panic in their handler (500,
	// logged to nowhere); only where each call goes matters.
	ts := httptest.NewServer(New(Options{Meta: m, Router: rt, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(ts.Close)

	call := func(method, path, body string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, body := call("POST", "/v1/sandboxes/sbx-a/exec", `{"args":["true"]}`, nil)
	got.Lock()
	if code != http.StatusTeapot || body != "from the owner" || got.method != "POST" || got.path != "/v1/sandboxes/sbx-a/exec" ||
		got.auth != "Bearer "+key || got.by != "node-here" || got.body != `{"args":["true"]}` {
		t.Fatalf("forwarded exec: %d %q; the owner saw %s %s auth %q by %q body %q", code, body, got.method, got.path, got.auth, got.by, got.body)
	}
	got.path = ""
	got.Unlock()
	// A session's client events go to the node that runs it (its
	// sandbox's), whose runner they wake.
	rt.asked = nil
	code, body = call("POST", "/v1/sessions/ses-a/events", `{"type":"user_message","payload":{"text":"hi"}}`, nil)
	got.Lock()
	if code != http.StatusTeapot || got.path != "/v1/sessions/ses-a/events" || len(rt.asked) != 1 || rt.asked[0] != "ses-a" {
		t.Fatalf("forwarded session event: %d %q; the owner saw %s %s; router asked %v", code, body, got.method, got.path, rt.asked)
	}
	got.path = ""
	got.Unlock()

	// A checkpoint's restore goes to the node of its sandbox (in place).
	rt.asked = nil
	code, _ = call("POST", "/v1/checkpoints/ckpt-a/restore", `{}`, nil)
	got.Lock()
	if code != http.StatusTeapot || got.path != "/v1/checkpoints/ckpt-a/restore" || len(rt.asked) != 1 || rt.asked[0] != "ckpt-a" {
		t.Fatalf("forwarded restore: %d; the owner saw %s; router asked %v", code, got.path, rt.asked)
	}
	got.path = ""
	got.Unlock()
	// An exposed port's URL (no API key: the token in the path is the
	// credential) goes to the node that runs the sandbox, path intact.
	rt.asked = nil
	code, body = call("GET", "/p/sbx-a/8080/tok123/index.html?x=1", "", map[string]string{"Authorization": ""})
	got.Lock()
	if code != http.StatusTeapot || got.path != "/p/sbx-a/8080/tok123/index.html" || len(rt.asked) != 1 || rt.asked[0] != "sbx-a" {
		t.Fatalf("forwarded port URL: %d %q; the owner saw %s %s; router asked %v", code, body, got.method, got.path, rt.asked)
	}
	got.path = ""
	got.Unlock()

	// Already forwarded once: answered here, never forwarded again (the
	// handler then refuses: there is no engine in this test, so any
	// answer but the owner's will do).
	rt.asked = nil
	if code, body := call("POST", "/v1/sandboxes/sbx-a/kill", "", map[string]string{forwardedHeader: "node-x"}); code == http.StatusTeapot || body == "from the owner" {
		t.Fatalf("a forwarded call was forwarded again: %d %q", code, body)
	}
	if len(rt.asked) != 0 {
		t.Fatalf("the router was asked about a forwarded call: %v", rt.asked)
	}
	// Owner down: 503, retry.
	rt.err = errdefs.Unavailablef("node down")
	if code, _ := call("POST", "/v1/sandboxes/sbx-a/kill", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("call for a sandbox whose node is down: %d, want 503", code)
	}
	// Reads every node answers: the router is not asked.
	rt.err, rt.asked = nil, nil
	for path := range anyNodeAnswers {
		method, p, _ := strings.Cut(path, " ")
		if method != "GET" {
			continue
		}
		func() {
			defer func() { recover() }() // no engine here: only the routing matters
			id := "sbx-a"
			if strings.HasPrefix(p, "/v1/sessions/") {
				id = "ses-a"
			}
			req, _ := http.NewRequest(method, ts.URL+strings.ReplaceAll(p, "{id}", id), nil)
			req.Header.Set("Authorization", "Bearer "+key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	got.Lock()
	defer got.Unlock()
	if len(rt.asked) != 0 || got.path != "" {
		t.Fatalf("reads answered from the shared stores were routed: asked %v, owner saw %q", rt.asked, got.path)
	}
}
