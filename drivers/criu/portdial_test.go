package criu

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// TestDialPort reaches an HTTP server that listens on the sandbox's loopback
// only, from the daemon, through DialPort; a port nobody listens on is
// refused; the daemon's own namespace is untouched afterwards.
func TestDialPort(t *testing.T) {
	requireHost(t)
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	ctx := context.Background()
	td.sh(id, "mkdir -p /www && echo hello-from-criu > /www/index.html")
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}); err != nil {
		t.Fatal(err)
	}
	var conn interface {
		io.ReadWriteCloser
	}
	var setup time.Duration
	deadline := time.Now().Add(10 * time.Second)
	for {
		start := time.Now()
		c, err := td.DialPort(ctx, id, 8080)
		setup = time.Since(start)
		if err == nil {
			conn = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DialPort: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "hello-from-criu" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}

	// Connection setup time, warm.
	const n = 20
	start := time.Now()
	for range n {
		c, err := td.DialPort(ctx, id, 8080)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	t.Logf("criu DialPort: first %v, mean of %d: %v", setup, n, time.Since(start)/n)

	start = time.Now()
	for range n {
		td.DialPort(ctx, id, 8081)
	}
	t.Logf("criu DialPort of a closed port (no server involved): mean of %d: %v", n, time.Since(start)/n)
	if _, err := td.DialPort(ctx, id, 8081); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial of a closed port: %v", err)
	}
	if _, err := td.DialPort(ctx, id, 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("port 0: %v", err)
	}
	// The host does not see the sandbox's listener on its own loopback.
	if c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp4", "127.0.0.1:8080"); err == nil {
		c.Close()
		t.Log("note: something listens on the host's 127.0.0.1:8080 (not the sandbox)")
	}
}
