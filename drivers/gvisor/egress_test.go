package gvisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/lib/netns"
)

// TestEgressAcrossRestore: a sandbox reaches a server on the host only
// through the gateway, by name, and does again after a checkpoint and an
// in-place restore (the veth is re-plumbed into gVisor's network stack).
func TestEgressAcrossRestore(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ledger := egresstest.NewLedger(t, true)
	path := egresstest.Start(t, map[string]netip.AddrPort{"payments.test": ledger.Addr()})
	d, err := New(Options{StateDir: testStateDir(t), RunscPath: runsc, CgroupParent: testCgroupParent(t, "/amber/gvisor-egress"),
		Logger: testLogger(t), Network: path.Network})
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("egress-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: minimalTemplate(t)}
	t.Cleanup(func() {
		_ = d.Destroy(context.Background(), id)
		if netns.Pinned(path.Network.GatewayNetns(id)) {
			t.Errorf("gateway namespace of %s left after Destroy", id)
		}
	})
	path.StartRun(t, "t1", id, "run-0")
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mustSh(t, d, id, fmt.Sprintf("printf '%s' > /etc/resolv.conf", egress.ResolvConf))
	// busybox-static's wget crashes in glibc's static resolver (even for
	// an address); its nslookup and nc do not.
	get := func() string {
		script := fmt.Sprintf(`ip=$(nslookup payments.test %s | sed -n 's/^Address: *\(198\.[0-9.]*\)$/\1/p')
printf 'GET /ping HTTP/1.0\r\nHost: payments.test:%[2]d\r\n\r\n' | nc -w 10 $ip %[2]d`,
			egress.GatewayAddr, ledger.Addr().Port())
		out, err := sh(d, id, script)
		if err != nil {
			t.Fatalf("GET /ping in the sandbox: %v", err)
		}
		return out
	}
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway: %q", out)
	}
	// Directly to the host's address is not a way out.
	if out, err := sh(d, id, fmt.Sprintf("printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' | nc -w 5 %s %d", ledger.Addr().Addr(), ledger.Addr().Port())); err == nil && strings.Contains(out, "pong") {
		t.Fatal("the sandbox reached the host's loopback server directly")
	}

	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	path.StartRun(t, "t1", id, "run-1")
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway after restore: %q", out)
	}
	if n := ledger.Requests(); n != 2 {
		t.Fatalf("ledger saw %d requests, want 2", n)
	}
}

// TestEgressStreamAcrossRestore: a TCP stream to the outside, through the
// gateway, survives a checkpoint-and-stop and an in-place restore: gVisor
// restores the connection's state in its network stack, the veth and the
// gateway's end never moved, and the outside server sees no disconnect.
// (That the engine resets such connections when the restore is not of the
// cut the sandbox stopped at is TestE2EStreamAcrossRestore's.)
func TestEgressStreamAcrossRestore(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c) // echo until the peer goes
				c.Close()
				closed <- struct{}{}
			}()
		}
	}()
	echo := netip.MustParseAddrPort(ln.Addr().String())
	path := egresstest.Start(t, map[string]netip.AddrPort{"echo.test": echo})
	d, err := New(Options{StateDir: testStateDir(t), RunscPath: runsc, CgroupParent: testCgroupParent(t, "/amber/gvisor-egress-stream"),
		Logger: testLogger(t), Network: path.Network})
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("egress-stream-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: minimalTemplate(t)}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	path.StartRun(t, "t1", id, "run-0")
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`ip=$(nslookup echo.test %s | sed -n 's/^Address: *\(198\.[0-9.]*\)$/\1/p')
(while :; do echo ping; sleep 0.2; done) | nc $ip %d > /tmp/echo.out; echo "ended $?" > /tmp/echo.end`, egress.GatewayAddr, echo.Port())
	if _, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what, cond string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			if _, err := sh(d, id, cond); err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("echoes through the gateway", "grep -q ping /tmp/echo.out", 20*time.Second)
	if _, err := sh(d, id, "test -e /tmp/echo.end"); err == nil {
		t.Fatal("the stream ended before the cut")
	}
	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	path.StartRun(t, "t1", id, "run-1")
	n1, _ := sh(d, id, "wc -l < /tmp/echo.out")
	waitFor("the stream goes on after the restore", fmt.Sprintf("test $(wc -l < /tmp/echo.out) -ge %d", atoi(n1)+5), 30*time.Second)
	if _, err := sh(d, id, "test -e /tmp/echo.end"); err == nil {
		out, _ := sh(d, id, "cat /tmp/echo.end")
		t.Fatalf("the stream ended across the restore: %s", out)
	}
	select {
	case <-closed:
		t.Fatal("the outside server saw the connection close")
	default:
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
