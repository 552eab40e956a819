package gvisor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestPatchDigest: PatchDigest is the digest runsc.sh computes of the
// patches it applies, so a changed patch cannot be run by a driver that
// still accepts the binary built without it.
func TestPatchDigest(t *testing.T) {
	patches, err := filepath.Glob("../../scripts/setup/runsc-*.patch")
	if err != nil || len(patches) == 0 {
		t.Fatalf("no scripts/setup/runsc-*.patch (%v)", err)
	}
	sort.Strings(patches)
	h := sha256.New()
	for _, p := range patches {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	if got := hex.EncodeToString(h.Sum(nil))[:12]; got != PatchDigest {
		t.Fatalf("the patches digest to %s, PatchDigest is %s: update it (and rerun make setup-runsc)", got, PatchDigest)
	}
}

// TestCheckRunscBuild: only the build with the pin and the patches'
// digest passes; the pinned module installed unpatched (the way runsc.sh
// once did), older patches or another program are refused, each with a
// message naming what it is.
func TestCheckRunscBuild(t *testing.T) {
	ld := func(version, patches string) []debug.BuildSetting {
		v := "-X gvisor.dev/gvisor/runsc/version.version=" + version
		if patches != "" {
			v += " -X gvisor.dev/gvisor/runsc/version.amberPatches=" + patches
		}
		return []debug.BuildSetting{{Key: "-ldflags", Value: v}}
	}
	cases := []struct {
		name     string
		main     string
		settings []debug.BuildSetting
		want     string // "" = accepted
	}{
		{"patched", "gvisor.dev/gvisor", ld(PinnedVersion, PatchDigest), ""},
		{"unpatched", "gvisor.dev/gvisor", ld(PinnedVersion, ""), "with patches none"},
		{"old patches", "gvisor.dev/gvisor", ld(PinnedVersion, "000000000000"), "with patches 000000000000"},
		{"another pin", "gvisor.dev/gvisor", ld("v0.0.0-20250101000000-000000000000", PatchDigest), "gvisor.dev/gvisor v0.0.0-20250101000000-000000000000"},
		{"no stamp", "gvisor.dev/gvisor", nil, "gvisor.dev/gvisor none with patches none"},
		{"go install", "command-line-arguments", ld(PinnedVersion, PatchDigest), "not of gvisor.dev/gvisor"},
	}
	for _, c := range cases {
		bi := &buildinfo.BuildInfo{}
		bi.Main.Path = c.main
		bi.Settings = c.settings
		err := checkRunscBuild(bi)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestDialPortKeepsEveryByte: 16 MiB each way through DialPort (runsc's
// port-forward proxy, the path of the agent's uploads and of every exposed
// port) arrive whole while the other end reads slowly. The unpatched proxy
// wrote each chunk into the sandbox once and dropped what a full netstack
// send buffer did not take (the way out kept every byte even then).
//
//	go test -tags seccomp -count=1 -run TestDialPortKeepsEveryByte -v ./drivers/gvisor
func TestDialPortKeepsEveryByte(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-portstream")
	if err := d.Check(ctx); err != nil {
		t.Fatalf("the installed runsc: %v", err)
	}
	id := fmt.Sprintf("portstream-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	const size = 16 << 20

	t.Run("into the sandbox", func(t *testing.T) {
		// The reader waits 3 s before it reads: the pipe, the sandbox's
		// receive buffer and the proxy's send buffer all fill.
		if _, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c",
			fmt.Sprintf("sleep 600 | nc -l -p 9000 | { sleep 3; head -c %d > /tmp/got; sha256sum /tmp/got > /tmp/sum; }", size)}}); err != nil {
			t.Fatal(err)
		}
		blob := make([]byte, size)
		_, _ = rand.Read(blob)
		want := sha256.Sum256(blob)
		c := dialRetry(ctx, t, d, id, 9000)
		defer c.Close()
		_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
		if _, err := c.Write(blob); err != nil {
			t.Fatalf("write: %v", err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			sum, _ := sh(d, id, "cat /tmp/sum 2>/dev/null")
			if sum != "" {
				if !strings.HasPrefix(sum, hex.EncodeToString(want[:])) {
					t.Fatalf("the sandbox got other bytes: %s", sum)
				}
				return
			}
			if time.Now().After(deadline) {
				got, _ := sh(d, id, "wc -c < /tmp/got")
				t.Fatalf("the sandbox has %s of %d bytes 30 s after the last was sent: bytes were lost", strings.TrimSpace(got), size)
			}
		}
	})

	t.Run("out of the sandbox", func(t *testing.T) {
		sum, err := sh(d, id, fmt.Sprintf("head -c %d /dev/urandom > /tmp/blob && sha256sum /tmp/blob", size))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "nc -l -p 9001 < /tmp/blob"}}); err != nil {
			t.Fatal(err)
		}
		c := dialRetry(ctx, t, d, id, 9001)
		defer c.Close()
		time.Sleep(3 * time.Second) // the host reads late: the proxy's writes to it fill up
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		h := sha256.New()
		n, err := io.CopyN(h, c, size)
		if err != nil {
			t.Fatalf("read %d of %d bytes: %v", n, size, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); !strings.HasPrefix(sum, got) {
			t.Fatalf("the host got other bytes: %s, the sandbox sent %s", got, sum)
		}
	})
}

// dialRetry dials port once something listens on it in the sandbox (a
// dial before that connects to the proxy, which then finds no listener).
func dialRetry(ctx context.Context, t *testing.T, d *Driver, id string, port int) net.Conn {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if out, _ := sh(d, id, "netstat -ltn"); strings.Contains(out, fmt.Sprintf(":%d ", port)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %d", port)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := d.DialPort(ctx, id, port)
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %d: %v", port, err)
		}
	}
}
