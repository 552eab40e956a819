package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"
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

	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
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
		if h := hdr["Host"]; h != "" {
			req.Host = h
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
	// An exposed port's origin (no API key: the token is the credential)
	// goes to the node that runs the sandbox, path intact.
	rt.asked = nil
	code, body = call("GET", "/index.html?x=1&amber_token=tok123", "", map[string]string{"Authorization": "", "Host": "8080-sbx-a." + DefaultPortDomain})
	got.Lock()
	if code != http.StatusTeapot || got.path != "/index.html" || len(rt.asked) != 1 || rt.asked[0] != "sbx-a" {
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

// fakePlacer is a fakeRouter that places new sandboxes at place (or fails
// with placeErr) and records the templates it was asked about.
type fakePlacer struct {
	fakeRouter
	place     string
	placeErr  error
	templates []string
}

func (f *fakePlacer) Place(_ context.Context, template string) (string, error) {
	f.mu.Lock()
	f.templates = append(f.templates, template)
	f.mu.Unlock()
	return f.place, f.placeErr
}

// TestPlaceCreates: a create (or a restore as new) that this node should
// not take is proxied once to the node placement picks, with its body and
// the forwarded-by header; placement learns the template from the body; a
// create already forwarded is not placed again; no node with room answers
// the placer's error (429 naming why); a restore in place is not placed.
func TestPlaceCreates(t *testing.T) {
	var got struct {
		sync.Mutex
		path, by, body string
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Lock()
		got.path, got.by, got.body = r.URL.Path, r.Header.Get(forwardedHeader), string(b)
		got.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "from the other node")
	}))
	t.Cleanup(other.Close)
	u, _ := url.Parse(other.URL)
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	key := "amber_test_placement_key_0123456789abcdef"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	pl := &fakePlacer{place: u.Host}
	ts := httptest.NewServer(New(Options{Meta: m, Router: pl, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(ts.Close)
	call := func(path, body string, hdr map[string]string) (int, string) {
		t.Helper()
		var code int
		var out string
		func() {
			defer func() { recover() }() // no engine here: only the routing matters
			req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			code, out = resp.StatusCode, string(b)
		}()
		return code, out
	}

	const create = `{"template":"python"}`
	code, body := call("/v1/sandboxes", create, nil)
	got.Lock()
	if code != http.StatusCreated || body != "from the other node" || got.path != "/v1/sandboxes" || got.by != "node-here" || got.body != create {
		t.Fatalf("placed create: %d %q; the other node saw %q by %q body %q", code, body, got.path, got.by, got.body)
	}
	got.path = ""
	got.Unlock()
	if len(pl.templates) != 1 || pl.templates[0] != "python" {
		t.Fatalf("placement was asked about %v, want [python]", pl.templates)
	}

	code, _ = call("/v1/checkpoints/ckpt-x/restore", `{"as_new":true}`, nil)
	got.Lock()
	if code != http.StatusCreated || got.path != "/v1/checkpoints/ckpt-x/restore" {
		t.Fatalf("restore as new: %d; the other node saw %q", code, got.path)
	}
	got.path = ""
	got.Unlock()

	// Forwarded already, or a restore in place: answered here.
	pl.templates = nil
	if code, body := call("/v1/sandboxes", create, map[string]string{forwardedHeader: "node-x"}); code == http.StatusCreated || body == "from the other node" {
		t.Fatalf("a forwarded create was placed again: %d %q", code, body)
	}
	if code, body := call("/v1/checkpoints/ckpt-x/restore", `{}`, nil); code == http.StatusCreated || body == "from the other node" {
		t.Fatalf("a restore in place was placed: %d %q", code, body)
	}
	if len(pl.templates) != 0 {
		t.Fatalf("placement was asked about calls it must not place: %v", pl.templates)
	}

	// No node with room: the placer's error, as its status.
	pl.placeErr = errdefs.ResourceExhaustedf("no node can take a new sandbox: node-b is full (2 of 2 sandboxes)")
	if code, body := call("/v1/sandboxes", create, nil); code != http.StatusTooManyRequests || !strings.Contains(body, "node-b is full") {
		t.Fatalf("create with no node with room: %d %q, want 429 naming node-b", code, body)
	}
	got.Lock()
	defer got.Unlock()
	if got.path != "" {
		t.Fatalf("calls answered here reached the other node: %q", got.path)
	}
}

// TestForwardFullDuplex: a forwarded call whose answer starts before its
// body has been sent (an exec streams its output; stdin may still come)
// reaches the owner whole: the proxy keeps sending the body after the
// answer's headers went back to the client.
func TestForwardFullDuplex(t *testing.T) {
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		rc.Flush() // the answer starts before the body is read
		b, err := io.ReadAll(r.Body)
		if err != nil {
			io.WriteString(w, "read error: "+err.Error())
			return
		}
		io.WriteString(w, "got "+string(b))
	}))
	t.Cleanup(owner.Close)
	u, _ := url.Parse(owner.URL)
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	key := "amber_test_duplex_key_0123456789abcdef"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(Options{Meta: m, Router: &fakeRouter{owner: u.Host}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { // a stuck proxy must not hang the Closes
		ts.CloseClientConnections()
		owner.CloseClientConnections()
	})

	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", ts.URL+"/v1/sandboxes/sbx-a/exec?arg=cat", pr)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/octet-stream")
	// One writer, in order: "first " now, "second" once the answer's
	// headers are back (two writers raced, and "first " could land after
	// the pipe was closed).
	answered := make(chan struct{})
	go func() {
		io.WriteString(pw, "first ")
		<-answered
		io.WriteString(pw, "second")
		pw.Close()
	}()
	// A proxy that waits for the whole body before it answers fails here
	// after 20 s rather than hang.
	stop := time.AfterFunc(20*time.Second, func() { pw.CloseWithError(errors.New("no answer before the body ended")) })
	defer stop.Stop()
	resp, err := http.DefaultClient.Do(req) // returns once the headers are back
	close(answered)                         // the rest of the body goes after the answer started
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "got first second" {
		t.Fatalf("forwarded full-duplex call: answer %q, %v; want the owner to get the whole body", b, err)
	}
}
