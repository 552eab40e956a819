package gvisor

import (
	"context"
	"fmt"
	"os"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/internal/netns"
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
