package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// waitHTTP GETs u through the daemon at base until it answers 200 (the
// server inside the sandbox is starting) and returns the body.
func waitHTTP(t *testing.T, base, u string) string {
	t.Helper()
	hc := daemonClient(base)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get(u)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return string(b)
			}
			err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", u, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func status(t *testing.T, base, u string) int {
	t.Helper()
	resp, err := daemonClient(base).Get(u)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestExposePortHTTP serves a page from busybox httpd listening on the
// sandbox's loopback, through the daemon's proxy on the port's own origin
// (http://8080-SBX.ports.localhost:PORT/, reached at 127.0.0.1).
func TestExposePortHTTP(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	if !env.Driver.Capabilities().PortForward {
		if _, ok := env.Driver.(sandbox.PortDialer); !ok {
			t.Skipf("driver %s cannot forward ports", env.Driver.Name())
		}
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, sb.ID, "/www", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/www/index.html", strings.NewReader("hello from the sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/www/a b.txt", strings.NewReader("spaced"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}); err != nil {
		t.Fatal(err)
	}

	// Connection setup time of the driver itself.
	pd := env.Driver.(sandbox.PortDialer)
	var first time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for {
		start := time.Now()
		conn, err := pd.DialPort(ctx, sb.ID, 8080)
		first = time.Since(start)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DialPort: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	const n = 10
	start := time.Now()
	for range n {
		conn, err := pd.DialPort(ctx, sb.ID, 8080)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	t.Logf("%s DialPort: %v, then mean of %d: %v", env.Driver.Name(), first, n, time.Since(start)/n)
	if _, err := pd.DialPort(ctx, sb.ID, 8099); err == nil {
		t.Fatal("DialPort of a port nobody listens on succeeded")
	}

	x, err := c.ExposePort(ctx, sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	bu, _ := url.Parse(base)
	origin := "http://8080-" + sb.ID + ".ports.localhost:" + bu.Port()
	if x.Token == "" || len(x.Token) < 40 || x.URL != origin+"/?amber_token="+x.Token {
		t.Fatalf("exposure %+v, want URL %s/?amber_token=…", x, origin)
	}
	at := func(origin, path, token string) string { return origin + path + "?amber_token=" + token }
	if got := waitHTTP(t, base, x.URL); got != "hello from the sandbox\n" {
		t.Fatalf("page through the proxy: %q", got)
	}
	if got := waitHTTP(t, base, at(origin, "/a%20b.txt", x.Token)); got != "spaced" {
		t.Fatalf("escaped path through the proxy: %q", got)
	}
	// Through the same connection again (the proxy keeps it), timed.
	start = time.Now()
	for range n {
		waitHTTP(t, base, x.URL)
	}
	t.Logf("GET through the proxy: mean of %d: %v", n, time.Since(start)/n)

	// Every wrong URL is the same 404, with or without an API key.
	wrongs := []string{
		at(origin, "/", strings.Repeat("A", len(x.Token))),
		strings.Replace(x.URL, "//8080-", "//8081-", 1),
		strings.Replace(x.URL, sb.ID, "sbx-nope", 1),
		strings.Replace(x.URL, "//8080-", "//99999-", 1),
		strings.Replace(x.URL, "//8080-", "//08080-", 1),
		strings.Replace(x.URL, "//8080-", "//", 1),
		origin + "/",
		base + "/p/" + sb.ID + "/8080/",
		base + "/p/" + sb.ID + "/99999/" + x.Token + "/",
	}
	for _, w := range wrongs {
		if code := status(t, base, w); code != 404 {
			t.Errorf("GET %s = %d, want 404", w, code)
		}
	}

	ps, err := c.Ports(ctx, sb.ID)
	if err != nil || len(ps) != 1 || ps[0].Port != 8080 || ps[0].Token != "" || ps[0].URL != origin+"/" {
		t.Fatalf("ports: %+v %v", ps, err)
	}
	// A port where nothing listens: exposed, but the proxy answers 502.
	x2, err := c.ExposePort(ctx, sb.ID, 8099)
	if err != nil {
		t.Fatal(err)
	}
	if code := status(t, base, x2.URL); code != http.StatusBadGateway {
		t.Errorf("GET of a port nobody listens on = %d, want 502", code)
	}
	// Exposing again replaces the token.
	x3, err := c.ExposePort(ctx, sb.ID, 8080)
	if err != nil || x3.Token == x.Token {
		t.Fatalf("re-expose: %+v %v", x3, err)
	}
	if code := status(t, base, x.URL); code != 404 {
		t.Errorf("old token after re-expose = %d, want 404", code)
	}
	if got := waitHTTP(t, base, x3.URL); got != "hello from the sandbox\n" {
		t.Fatalf("page with the new token: %q", got)
	}
	if err := c.UnexposePort(ctx, sb.ID, 8080); err != nil {
		t.Fatal(err)
	}
	if code := status(t, base, x3.URL); code != 404 {
		t.Errorf("after unexpose = %d, want 404", code)
	}
	if err := c.UnexposePort(ctx, sb.ID, 8080); !errdefs.IsNotFound(err) {
		t.Errorf("unexpose twice: %v", err)
	}
	for _, p := range []int{0, 65536} {
		if _, err := c.ExposePort(ctx, sb.ID, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("expose port %d: %v", p, err)
		}
	}
	// Another tenant cannot expose or list this sandbox's ports.
	other, err := client.New(base, "not-a-key")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExposePort(ctx, sb.ID, 8080); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("expose without a valid key: %v", err)
	}
	// Destroying the sandbox removes its exposures.
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if code := status(t, base, x2.URL); code != 404 {
		t.Errorf("after destroy = %d, want 404", code)
	}
}

// TestExposePortUpgrade does an HTTP Upgrade (the WebSocket handshake's
// shape) through the proxy to a Python server in the sandbox that answers
// 101 and then echoes bytes both ways.
func TestExposePortUpgrade(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	if _, err := env.Catalog.Get("python"); err != nil {
		t.Skip("template python is not installed (make setup-python)")
	}
	if _, ok := env.Driver.(sandbox.PortDialer); !ok {
		t.Skipf("driver %s cannot forward ports", env.Driver.Name())
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	const server = `
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9000))
s.listen(8)
while True:
    c, _ = s.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(4096)
        if not d:
            break
        head += d
    if b"upgrade: websocket" not in head.lower():
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        c.close()
        continue
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    rest = head.split(b"\r\n\r\n", 1)[1]
    if rest:
        c.sendall(rest)
    while True:
        d = c.recv(4096)
        if not d:
            break
        c.sendall(d)
    c.close()
`
	if err := c.WriteFile(ctx, sb.ID, "/tmp/echo.py", strings.NewReader(server), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"python3", "/tmp/echo.py"}}); err != nil {
		t.Fatal(err)
	}
	x, err := c.ExposePort(ctx, sb.ID, 9000)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(x.URL)
	bu, _ := url.Parse(base)
	var conn net.Conn
	var resp *http.Response
	var br *bufio.Reader
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err = net.Dial("tcp", bu.Host) // the port's origin is served by the daemon
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nX-Amber-Port-Token: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", u.Host, x.Token)
		br = bufio.NewReader(conn)
		resp, err = http.ReadResponse(br, nil)
		if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer conn.Close()
	if !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		t.Fatalf("101 without Upgrade: websocket: %v", resp.Header)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	for _, msg := range []string{"ping", "a longer message\x00with binary\xff"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Fatalf("echo: %q %v", got, err)
		}
	}
}
