package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
)

// TestConsoleServed: /console/ serves the embedded app without a key, its
// assets with their type, any other path under it as index.html (the app
// routes in the browser), with a content security policy; the API still
// needs a key.
func TestConsoleServed(t *testing.T) {
	fsys := fstest.MapFS{
		"index.html":         {Data: []byte(`<!doctype html><script src="/console/assets/app.js"></script>`)},
		"assets/app.js":      {Data: []byte(`console.log(1)`)},
		"assets/app.css":     {Data: []byte(`body{}`)},
		"assets/nested/x.js": {Data: []byte(`1`)},
	}
	ts := httptest.NewServer(New(Options{Console: fsys}))
	defer ts.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := noRedirect.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if code, _, h := get("/console"); code != 301 || h.Get("Location") != "/console/" {
		t.Errorf("/console: %d %v", code, h)
	}
	for _, p := range []string{"/console/", "/console/sessions/ses-1", "/console/assets/missing.js"} {
		code, body, h := get(p)
		if code != 200 || !strings.Contains(body, "/console/assets/app.js") || !strings.HasPrefix(h.Get("Content-Type"), "text/html") ||
			!strings.Contains(h.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("%s: %d %q %v", p, code, body, h)
		}
	}
	if code, body, h := get("/console/assets/app.js"); code != 200 || body != "console.log(1)" || !strings.Contains(h.Get("Content-Type"), "javascript") || !strings.Contains(h.Get("Cache-Control"), "immutable") {
		t.Errorf("app.js: %d %q %v", code, body, h)
	}
	if code, _, h := get("/console/assets/app.css"); code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/css") {
		t.Errorf("app.css: %d %v", code, h)
	}
	if code, _, _ := get("/v1/info"); code != 401 {
		t.Errorf("/v1/info without a key beside the console: %d", code)
	}
	// Without a console, /console is an unknown route.
	ts2 := httptest.NewServer(New(Options{}))
	defer ts2.Close()
	resp, err := http.Get(ts2.URL + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("/console/ without a console: %d", resp.StatusCode)
	}
}
