package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// portClient is an HTTP client that sends every request to the daemon at
// addr whatever host its URL names (as *.localhost goes to loopback in a
// browser; Go's resolver does not do that, and no name is looked up): a
// port's origin is reached there by its Host. It follows no redirect.
func portClient(addr string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
}

// TestE2EPortExpose: `amber port expose` prints a URL on the port's own
// origin (http://8080-SBX.<port domain>:PORT/?amber_token=…, reached at the
// daemon's address with that Host) that serves a page from busybox httpd
// inside the sandbox; a browser's visit keeps the token as a cookie of
// that origin; ls lists the origin; rm makes it 404; the old /p/ path on
// the API's origin serves nothing but a redirect.
func TestE2EPortExpose(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--port-domain", "ports.e2e.localhost")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "sh", "-c", "mkdir -p /www && echo port-e2e > /www/index.html && httpd -p 127.0.0.1:8080 -h /www")
	u := strings.TrimSpace(d.must("port", "expose", id, "8080"))
	_, port, _ := net.SplitHostPort(addr)
	origin := "http://8080-" + id + ".ports.e2e.localhost:" + port
	if !strings.HasPrefix(u, origin+"/?amber_token=") {
		t.Fatalf("expose printed %q, want %s/?amber_token=…", u, origin)
	}
	hc := portClient(addr)
	get := func(u string, hdr ...string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", u, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, body := get(u)
		if resp.StatusCode == 200 && body == "port-e2e\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q", u, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A browser: the first navigation trades the token for a cookie of the
	// port's origin; the cookie alone opens the page afterwards.
	resp, _ := get(u, "Sec-Fetch-Mode", "navigate")
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "amber_port_token" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || cookie == nil || cookie.Domain != "" {
		t.Fatalf("first navigation = %d, cookie %+v; want 303 and a host-only cookie", resp.StatusCode, cookie)
	}
	if resp, body := get(origin+"/", "Cookie", cookie.Name+"="+cookie.Value); resp.StatusCode != 200 || body != "port-e2e\n" {
		t.Fatalf("GET with the cookie = %d %q", resp.StatusCode, body)
	}
	// The API's origin serves none of it.
	tok, _ := url.Parse(u)
	old := "http://" + addr + "/p/" + id + "/8080/" + tok.Query().Get("amber_token") + "/"
	if resp, body := get(old); resp.StatusCode != http.StatusPermanentRedirect || strings.Contains(body, "port-e2e") || !strings.HasPrefix(resp.Header.Get("Location"), origin+"/") {
		t.Fatalf("GET %s = %d %q Location %q, want a redirect to the port's origin", old, resp.StatusCode, body, resp.Header.Get("Location"))
	}
	if out := d.must("port", "ls", id); !strings.Contains(out, "8080") || !strings.Contains(out, origin+"/") {
		t.Fatalf("port ls: %q", out)
	}
	var x struct {
		URL   string `json:"url"`
		Token string `json:"token"`
		Port  int    `json:"port"`
	}
	if err := json.Unmarshal([]byte(d.must("port", "expose", "--json", id, "8080")), &x); err != nil || x.Port != 8080 || x.Token == "" || !strings.Contains(x.URL, x.Token) {
		t.Fatalf("expose --json: %+v %v", x, err)
	}
	if resp, _ := get(u); resp.StatusCode != 404 {
		t.Fatalf("the first URL after re-expose = %d, want 404", resp.StatusCode)
	}
	u = x.URL
	d.must("port", "rm", id, "8080")
	if resp, _ := get(u); resp.StatusCode != 404 {
		t.Fatalf("after rm = %d, want 404", resp.StatusCode)
	}
	if _, errs, code := d.amber("port", "expose", id, "http"); code != 2 || !strings.Contains(errs, "1..65535") {
		t.Fatalf("bad port: exit %d %q", code, errs)
	}
	d.must("sandbox", "rm", id)
	// A port domain that covers the API's own host is refused at start.
	if _, errs, code := d.amber("up", "--addr", "127.0.0.1:1", "--port-domain", "not a domain"); code != 2 || !strings.Contains(errs, "--port-domain") {
		t.Fatalf("up with a bad --port-domain: exit %d %q", code, errs)
	}
}
