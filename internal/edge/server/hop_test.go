package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/httpx"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestForwardRequiresNodeCredential: with a node token (--node-token-file)
// a node forwards a call to the sandbox's node with the token (whatever
// the client sent in its place), and a node refuses a call marked
// forwarded that lacks the token or carries another (401), on API routes
// and exposed ports alike; the token never reaches a handler. Without a
// token configured, forwarded calls are taken as before.
func TestForwardRequiresNodeCredential(t *testing.T) {
	const token = "node-token-0123456789abcdef0123456789"
	var got struct {
		sync.Mutex
		token, by, auth string
	}
	// The owner: a real server with the token, whose handler sees what
	// reaches it.
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	key := "amber_test_hop_key_0123456789abcdef"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ownerSrv := New(Options{Meta: m, Hop: &httpx.Hop{Token: token}, Logger: quiet})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ownerSrv.ServeHTTP(w, r)
	}))
	t.Cleanup(owner.Close)
	// A handler behind the owner's Admit, recording what passed it.
	probe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := ownerSrv.hop.Admit(r, forwardedHeader); err != nil {
			writeError(w, err)
			return
		}
		got.Lock()
		got.token, got.by, got.auth = r.Header.Get(httpx.NodeTokenHeader), r.Header.Get(forwardedHeader), r.Header.Get("Authorization")
		got.Unlock()
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(probe.Close)

	call := func(base, method, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
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

	// Straight to the owner, marked forwarded: refused without the token
	// or with another one, on an API route and on an exposed port's path.
	for _, path := range []string{"/v1/sandboxes/sbx-a/processes", "/healthz", "/p/sbx-a/8080/"} {
		for _, tok := range []string{"", "wrong-token-0123456789abcdef0123456789"} {
			hdr := map[string]string{forwardedHeader: "node-x"}
			if tok != "" {
				hdr[httpx.NodeTokenHeader] = tok
			}
			code, body := call(owner.URL, "GET", path, hdr)
			if code != http.StatusUnauthorized || !strings.Contains(body, "node token") {
				t.Errorf("GET %s marked forwarded with token %q: %d %s; want 401 naming the node token", path, tok, code, body)
			}
		}
	}
	if code, body := call(owner.URL, "GET", "/healthz", map[string]string{forwardedHeader: "node-x", httpx.NodeTokenHeader: token}); code != http.StatusOK {
		t.Errorf("a call forwarded with the token: %d %s", code, body)
	}
	if code, _ := call(owner.URL, "GET", "/healthz", nil); code != http.StatusOK {
		t.Errorf("a client's own call (not forwarded) needs no node token: %d", code)
	}

	// A node forwarding to the owner sends the token, not the client's.
	u, _ := url.Parse(probe.URL)
	sender := httptest.NewServer(New(Options{Meta: m, Router: &fakeRouter{owner: u.Host}, Hop: &httpx.Hop{Token: token}, Logger: quiet}))
	t.Cleanup(sender.Close)
	if code, body := call(sender.URL, "GET", "/v1/sandboxes/sbx-a/processes", map[string]string{httpx.NodeTokenHeader: "client-made-up"}); code != http.StatusTeapot {
		t.Fatalf("forwarded call: %d %s", code, body)
	}
	got.Lock()
	if got.by != "node-here" || got.token != "" || got.auth != "Bearer "+key {
		t.Errorf("at the owner: by %q, token %q (must be consumed by Admit), auth %q", got.by, got.token, got.auth)
	}
	got.Unlock()
	// The sender's token is what the owner checked: a sender with another
	// token is refused there.
	bad := httptest.NewServer(New(Options{Meta: m, Router: &fakeRouter{owner: u.Host}, Hop: &httpx.Hop{Token: "another-token-0123456789abcdef0123"}, Logger: quiet}))
	t.Cleanup(bad.Close)
	if code, body := call(bad.URL, "GET", "/v1/sandboxes/sbx-a/processes", nil); code != http.StatusUnauthorized {
		t.Errorf("a sender with another token: %d %s; want 401", code, body)
	}

	// No token configured: forwarded calls are taken as before.
	open := httptest.NewServer(New(Options{Meta: m, Logger: quiet}))
	t.Cleanup(open.Close)
	if code, body := call(open.URL, "GET", "/healthz", map[string]string{forwardedHeader: "node-x"}); code != http.StatusOK {
		t.Errorf("without a node token: %d %s", code, body)
	}
}

// TestForwardOverTLS: with the nodes' CA (--node-ca) a node forwards over
// HTTPS, verifying the other node's certificate, and the token goes inside
// the TLS connection; a node that does not trust the certificate does not
// send the call (503, retry).
func TestForwardOverTLS(t *testing.T) {
	const token = "node-token-0123456789abcdef0123456789"
	var sawTLS, sawToken atomic.Bool
	owner := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawTLS.Store(r.TLS != nil)
		sawToken.Store(r.Header.Get(httpx.NodeTokenHeader) == token)
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(owner.Close)
	u, _ := url.Parse(owner.URL)
	pool := x509.NewCertPool()
	pool.AddCert(owner.Certificate())
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	key := "amber_test_hop_tls_key_0123456789abcdef"
	m.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	call := func(hop *httpx.Hop) int {
		t.Helper()
		ts := httptest.NewServer(New(Options{Meta: m, Router: &fakeRouter{owner: u.Host}, Hop: hop, Logger: quiet}))
		defer ts.Close()
		req, _ := http.NewRequest("GET", ts.URL+"/v1/sandboxes/sbx-a/processes", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call(&httpx.Hop{Token: token, TLS: &tls.Config{RootCAs: pool}}); code != http.StatusTeapot || !sawTLS.Load() || !sawToken.Load() {
		t.Fatalf("forward over TLS: %d (tls %v, token %v)", code, sawTLS.Load(), sawToken.Load())
	}
	if code := call(&httpx.Hop{Token: token, TLS: &tls.Config{RootCAs: x509.NewCertPool()}}); code != http.StatusServiceUnavailable {
		t.Errorf("forward to a certificate the CA did not sign: %d, want 503", code)
	}
}
