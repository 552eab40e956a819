package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/sandbox"
)

// daemonClient is an HTTP client that sends every request to the daemon at
// base, whatever host its URL names (Host stays the URL's): port origins
// (<port>-<sandbox>.ports.localhost) are reached at 127.0.0.1 that way. It
// follows no redirect.
func daemonClient(base string) *http.Client {
	u, _ := url.Parse(base)
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, u.Host)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
}

// getVia GETs u through hc with hdr and returns the response (body read).
func getVia(t *testing.T, hc *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// originServer is a shell HTTP server for busybox nc: it writes each
// request's headers to /tmp/seen and answers with the headers a hostile
// page would send to act on the API's origin or persist in the browser.
const originServer = `#!/bin/sh
: > /tmp/seen.new
while IFS= read -r line; do
	line=$(printf '%s' "$line" | tr -d '\r')
	[ -z "$line" ] && break
	printf '%s\n' "$line" >> /tmp/seen.new
done
mv /tmp/seen.new /tmp/seen
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nSet-Cookie: console_session=stolen; Path=/; Domain=localhost\r\nSet-Cookie: sibling=tossed; Path=/; Domain=ports.localhost\r\nSet-Cookie: own=kept; Path=/; HttpOnly\r\nSet-Cookie: amber_port_token=forged; Path=/\r\nService-Worker-Allowed: /\r\nClear-Site-Data: "*"\r\nStrict-Transport-Security: max-age=31536000; includeSubDomains\r\nContent-Length: 14\r\nConnection: close\r\n\r\nfrom-sandbox\r\n'
`

// TestPortOriginIsolation: an exposed port is served from its own origin,
// never the API's; the sandbox never sees the caller's Amber key, the
// exposure's token or the proxy's cookie; the sandbox cannot set cookies
// for another host (the API's, a sibling port's) nor headers that act
// beyond its origin or persist (Service-Worker-Allowed, Clear-Site-Data,
// HSTS); the old /p/ path on the API's origin serves no sandbox content.
func TestPortOriginIsolation(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	if _, ok := env.Driver.(sandbox.PortDialer); !ok {
		t.Skipf("driver %s cannot forward ports", env.Driver.Name())
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/srv.sh", strings.NewReader(originServer), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"nc", "-ll", "-p", "8080", "-e", "/srv.sh"}}); err != nil {
		t.Fatal(err)
	}
	x, err := c.ExposePort(ctx, sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	hc := daemonClient(base)
	u, err := url.Parse(x.URL)
	if err != nil {
		t.Fatal(err)
	}
	api0, _ := url.Parse(base)
	if u.Hostname() == api0.Hostname() {
		t.Errorf("exposed port %s is served on the API's origin %s", x.URL, base)
	}
	if want := "8080-" + sb.ID + ".ports.localhost"; u.Hostname() != want {
		t.Errorf("port URL host %q, want %q", u.Hostname(), want)
	}

	// The caller's Amber key, the token's cookie and an app cookie.
	hdr := map[string]string{
		"Authorization": "Bearer " + testKey,
		"Cookie":        "amber_port_token=" + x.Token + "; app=1",
	}
	var resp *http.Response
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, body = getVia(t, hc, x.URL, hdr)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q", x.URL, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.TrimSpace(body) != "from-sandbox" {
		t.Fatalf("body %q", body)
	}
	var seen strings.Builder
	if err := c.ReadFile(ctx, sb.ID, "/tmp/seen", &seen); err != nil {
		t.Fatal(err)
	}
	t.Logf("the sandbox saw:\n%s", seen.String())
	for _, bad := range []string{testKey, x.Token, "amber_port_token", "X-Amber-Forwarded-By"} {
		if strings.Contains(seen.String(), bad) {
			t.Errorf("the sandbox saw %q in the request:\n%s", bad, seen.String())
		}
	}
	if !strings.Contains(seen.String(), "app=1") {
		t.Errorf("the page's own cookie did not reach the sandbox:\n%s", seen.String())
	}

	var cookies []string
	for _, sc := range resp.Header.Values("Set-Cookie") {
		ck, err := http.ParseSetCookie(sc)
		if err != nil {
			t.Errorf("Set-Cookie %q: %v", sc, err)
			continue
		}
		cookies = append(cookies, ck.Name+"="+ck.Value)
		if ck.Domain != "" {
			t.Errorf("a cookie for domain %q reached the client: %q", ck.Domain, sc)
		}
		if ck.Name == "amber_port_token" && ck.Value != x.Token {
			t.Errorf("the sandbox set the proxy's token cookie: %q", sc)
		}
	}
	if !strings.Contains(strings.Join(cookies, " "), "own=kept") {
		t.Errorf("the port origin's own host-only cookie was dropped: %v", cookies)
	}
	for _, h := range []string{"Service-Worker-Allowed", "Clear-Site-Data", "Strict-Transport-Security"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("%s: %q from the sandbox reached the client", h, v)
		}
	}
	if v := resp.Header.Get("Cross-Origin-Opener-Policy"); v != "same-origin" {
		t.Errorf("Cross-Origin-Opener-Policy %q, want same-origin", v)
	}

	// A browser's first visit: the token in the query becomes a host-only
	// cookie and leaves the address bar (303 to the clean URL), and the
	// cookie alone opens the port afterwards.
	resp, _ = getVia(t, hc, x.URL, map[string]string{"Sec-Fetch-Mode": "navigate"})
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(resp.Header.Get("Location"), x.Token) {
		t.Errorf("first navigation = %d Location %q, want 303 without the token", resp.StatusCode, resp.Header.Get("Location"))
	}
	var tokenCookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "amber_port_token" {
			tokenCookie = ck
		}
	}
	if tokenCookie == nil || tokenCookie.Value != x.Token || tokenCookie.Domain != "" || !tokenCookie.HttpOnly {
		t.Errorf("first visit's cookie %+v, want the token, host-only, HttpOnly", tokenCookie)
	}
	origin := u.Scheme + "://" + u.Host + "/"
	if resp, _ := getVia(t, hc, origin, map[string]string{"Cookie": "amber_port_token=" + x.Token}); resp.StatusCode != 200 {
		t.Errorf("GET %s with the token's cookie = %d", origin, resp.StatusCode)
	}
	if resp, _ := getVia(t, hc, origin, map[string]string{"X-Amber-Port-Token": x.Token}); resp.StatusCode != 200 {
		t.Errorf("GET %s with the token's header = %d", origin, resp.StatusCode)
	}
	if resp, _ := getVia(t, hc, origin, map[string]string{"Authorization": "Bearer " + testKey}); resp.StatusCode != 404 {
		t.Errorf("GET %s with an API key and no token = %d, want 404", origin, resp.StatusCode)
	}

	// The old path form on the API's origin serves nothing of the sandbox.
	old := base + "/p/" + sb.ID + "/8080/" + x.Token + "/"
	resp, body = getVia(t, hc, old, hdr)
	if strings.Contains(body, "from-sandbox") || resp.Header.Get("Service-Worker-Allowed") != "" || len(resp.Header.Values("Set-Cookie")) != 0 {
		t.Errorf("GET %s on the API's origin = %d %q %v: sandbox content", old, resp.StatusCode, body, resp.Header)
	}
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || !strings.HasPrefix(loc, u.Scheme+"://"+u.Host+"/") {
		t.Errorf("GET %s = %d Location %q, want 308 to the port's origin", old, resp.StatusCode, loc)
	}
}
