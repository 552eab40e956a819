package criu

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/lib/netns"
)

// Egress under the criu driver (network.go): a sandbox's pinned network
// namespace is plumbed to the gateway, and CRIU restores its live TCP
// connections into it.
//
//	go test -tags seccomp -count=1 -run 'TestEgress' -v ./drivers/criu

// newEgressDriver is a test driver whose sandboxes reach the outside
// through path's gateway. Its cleanup also fails the test when the
// gateway namespace of one of its sandboxes survives Destroy.
func newEgressDriver(t *testing.T, path *egresstest.Path) *testDriver {
	t.Helper()
	td := newTestDriver(t)
	requireCriu(t, td)
	opts := td.options()
	opts.Network = path.Network
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	td.Driver = d
	// Runs before td's own cleanup (which then finds nothing to destroy).
	t.Cleanup(func() {
		infos, _ := td.List(context.Background())
		for _, info := range infos {
			if err := td.Destroy(context.Background(), info.ID); err != nil {
				t.Errorf("cleanup: destroy %s: %v", info.ID, err)
			}
			if gw := path.Network.GatewayNetns(info.ID); netns.Pinned(gw) {
				t.Errorf("cleanup: gateway namespace %s left after Destroy", gw)
			}
		}
	})
	return td
}

// TestEgressThroughGateway: a criu sandbox resolves a name through the
// gateway's DNS and reaches the ledger by it; the host's address itself is
// no way out; sandbox root cannot reconfigure the namespace; after a
// checkpoint-and-stop and a restore in place it reaches the ledger again;
// and Destroy removes the namespace and the gateway's plumbing.
func TestEgressThroughGateway(t *testing.T) {
	ledger := egresstest.NewLedger(t, true)
	path := egresstest.Start(t, map[string]netip.AddrPort{"payments.test": ledger.Addr()})
	td := newEgressDriver(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	id := newID("egress")
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	path.StartRun(t, "t1", id, "run-0")
	if _, err := td.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	td.sh(id, fmt.Sprintf("printf '%s' > /etc/resolv.conf", egress.ResolvConf))
	getFrom := func(td *testDriver, id string) string { return pingLedger(td, id, ledger.Addr().Port()) }
	get := func() string { return getFrom(td, id) }
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway: %q", out)
	}
	if out, _, st := td.run(id, "/bin/sh", "-c", fmt.Sprintf("printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' | nc -w 5 %s %d", ledger.Addr().Addr(), ledger.Addr().Port())); st.Code == 0 && strings.Contains(out, "pong") {
		t.Fatal("the sandbox reached the host's loopback server directly")
	}
	// The namespace belongs to the host's user namespace: sandbox root
	// cannot touch its interfaces or routes.
	if out, errs, st := td.run(id, "/bin/sh", "-c", "ip link set eth0 down || exit 7; ip route del default || exit 8"); st.Code == 0 {
		t.Fatalf("sandbox root reconfigured its network: %q %q", out, errs)
	}
	if out := td.sh(id, "cat /sys/class/net/lo/operstate /sys/class/net/eth0/operstate; ip -o -4 addr show eth0"); !strings.Contains(out, egress.SandboxAddr.String()) {
		t.Fatalf("sandbox interfaces: %q", out)
	}

	image := filepath.Join(t.TempDir(), "image")
	if _, err := td.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	checkNetnsImage(t, image, egress.SandboxAddr.Addr().String()+"/32")
	if _, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	path.StartRun(t, "t1", id, "run-1")
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway after restore: %q", out)
	}
	// The driver made the restored namespace: loopback up, with the
	// sandbox's address on it.
	if out := td.sh(id, "cat /sys/class/net/lo/operstate; ip -o -4 addr show lo"); !strings.Contains(out, egress.SandboxAddr.Addr().String()+"/32") {
		t.Fatalf("restored loopback: %q", out)
	}
	if n := ledger.Requests(); n != 2 {
		t.Fatalf("ledger saw %d requests, want 2", n)
	}
	gw := path.Network.GatewayNetns(id)
	if !netns.Pinned(gw) {
		t.Fatalf("gateway namespace %s not pinned while the sandbox runs", gw)
	}
	// A fork (a restore into another id) gets a plumbing of its own.
	fork := newID("egress-fork")
	path.StartRun(t, "t1", fork, "run-0")
	if _, err := td.Restore(ctx, sandbox.Spec{ID: fork, Template: spec.Template}, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := getFrom(td, fork); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway from a fork: %q", out)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if netns.Pinned(gw) {
		t.Fatal("the gateway namespace of the sandbox is left after Destroy")
	}
	// A node that never had the sandbox plumbs it too.
	other := newEgressDriver(t, path)
	path.StartRun(t, "t1", id, "run-2")
	if _, err := other.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := getFrom(other, id); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway after a restore on another node: %q", out)
	}
	if n := ledger.Requests(); n != 4 {
		t.Fatalf("ledger saw %d requests, want 4", n)
	}

}

// echoServer is an outside TCP server on loopback that echoes each line
// back and records, per connection, when the peer went.
type echoServer struct {
	ln net.Listener
	mu sync.Mutex
	// accepted counts connections; ended holds how each ended.
	accepted int
	ended    []string
}

func newEchoServer(t *testing.T) *echoServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &echoServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.accepted++
			s.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						s.mu.Lock()
						s.ended = append(s.ended, err.Error())
						s.mu.Unlock()
						return
					}
					if _, err := c.Write([]byte("echo " + line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *echoServer) addr() netip.AddrPort { return netip.MustParseAddrPort(s.ln.Addr().String()) }

func (s *echoServer) state() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, append([]string(nil), s.ended...)
}

// holdConn is a python program that opens one connection to echo.test
// through the gateway and keeps it: for each n = 1, 2, ... it waits for
// /tmp/go-n, sends "msg n", and logs the echo (or the error it got, and
// exits) to /tmp/conn.log.
const holdConn = `
import socket, os, time
ip = socket.gethostbyname("echo.test")
s = socket.create_connection((ip, %d), timeout=10)
s.settimeout(None)
log = open("/tmp/conn.log", "a", buffering=1)
log.write("connected %%s\n" %% (s.getsockname(),))
n = 1
while True:
    while not os.path.exists("/tmp/go-%%d" %% n):
        time.sleep(0.05)
    try:
        s.settimeout(30)
        s.sendall(b"msg %%d\n" %% n)
        data = s.recv(100)
        if not data:
            log.write("eof %%d\n" %% n)
            break
        log.write("got %%d %%s\n" %% (n, data.decode().strip()))
    except Exception as e:
        log.write("error %%d %%s: %%s\n" %% (n, type(e).__name__, e))
        break
    n += 1
`

// startHolder creates a python sandbox that holds a connection to echo
// through path's gateway and has exchanged message 1 on it.
func startHolder(t *testing.T, ctx context.Context, td *testDriver, path *egresstest.Path, echo *echoServer) sandbox.Spec {
	t.Helper()
	id := newID("egress-hold")
	spec := sandbox.Spec{ID: id, Template: pythonTemplate(t)}
	path.StartRun(t, "t1", id, "run-0")
	if _, err := td.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	td.sh(id, fmt.Sprintf("printf '%s' > /etc/resolv.conf", egress.ResolvConf))
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", fmt.Sprintf(holdConn, echo.addr().Port())}}); err != nil {
		t.Fatal(err)
	}
	exchange(t, td, id, 1, "got 1 echo msg 1")
	return spec
}

// exchange lets the holder send message n and waits for its log to show
// want (or the error it got instead).
func exchange(t *testing.T, td *testDriver, id string, n int, want string) string {
	t.Helper()
	td.sh(id, fmt.Sprintf("touch /tmp/go-%d", n))
	deadline := time.Now().Add(60 * time.Second)
	for {
		log := td.sh(id, "cat /tmp/conn.log 2>/dev/null || true")
		if strings.Contains(log, want) {
			return log
		}
		if strings.Contains(log, fmt.Sprintf("error %d", n)) || strings.Contains(log, fmt.Sprintf("eof %d", n)) || time.Now().After(deadline) {
			t.Fatalf("message %d: want %q in the holder's log:\n%s", n, want, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEgressConnectionAcrossPlannedMove: a connection to the outside,
// through the gateway, survives a checkpoint-and-stop and a restore in
// place, eager or lazy: after the restore the same socket sends and
// receives, and the outside server saw one connection that never ended.
func TestEgressConnectionAcrossPlannedMove(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(map[bool]string{false: "eager", true: "lazy"}[lazy], func(t *testing.T) { testPlannedMove(t, lazy) })
	}
}

func testPlannedMove(t *testing.T, lazy bool) {
	echo := newEchoServer(t)
	path := egresstest.Start(t, map[string]netip.AddrPort{"echo.test": echo.addr()})
	td := newEgressDriver(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := startHolder(t, ctx, td, path, echo)
	id := spec.ID
	image := filepath.Join(t.TempDir(), "image")
	cs, err := td.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: frozen %v", cs.Frozen)
	if acc, ended := echo.state(); acc != 1 || len(ended) != 0 {
		t.Fatalf("after the checkpoint-and-stop the outside saw %d connections, ended: %v", acc, ended)
	}
	if lazy && !td.Capabilities().LazyRestore {
		t.Skip("LazyRestore is off")
	}
	rs, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{Lazy: lazy})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Lazy != lazy {
		t.Fatalf("restore: lazy %v, asked %v", rs.Lazy, lazy)
	}
	if rs.ConnectionsRestored < 1 || rs.ConnectionsReset != 0 {
		t.Fatalf("restore stats: %d connections restored, %d reset", rs.ConnectionsRestored, rs.ConnectionsReset)
	}
	path.StartRun(t, "t1", id, "run-1")
	log := exchange(t, td, id, 2, "got 2 echo msg 2")
	exchange(t, td, id, 3, "got 3 echo msg 3")
	if n := strings.Count(log, "connected"); n != 1 {
		t.Fatalf("the holder connected %d times:\n%s", n, log)
	}
	if acc, ended := echo.state(); acc != 1 || len(ended) != 0 {
		t.Fatalf("the outside saw %d connections, ended: %v", acc, ended)
	}
}

// TestEgressConnectionAfterCrash: a sandbox cut while it held a
// connection, which then went on using it and crashed (killed, no
// checkpoint), is restored from the older cut: its restored connection
// fails cleanly — the process gets a reset or an end of stream, within
// seconds — and never hangs; a new connection works.
func TestEgressConnectionAfterCrash(t *testing.T) {
	echo := newEchoServer(t)
	path := egresstest.Start(t, map[string]netip.AddrPort{"echo.test": echo.addr()})
	td := newEgressDriver(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := startHolder(t, ctx, td, path, echo)
	id := spec.ID
	image := filepath.Join(t.TempDir(), "image")
	if _, err := td.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	exchange(t, td, id, 2, "got 2 echo msg 2") // past the cut
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	path.StartRun(t, "t1", id, "run-1")
	// The restored holder is at the cut: message 2 again, on the old socket.
	td.sh(id, "touch /tmp/go-2")
	deadline := time.Now().Add(45 * time.Second)
	var log string
	for {
		log = td.sh(id, "cat /tmp/conn.log")
		if strings.Contains(log, "error 2") || strings.Contains(log, "eof 2") {
			break
		}
		if strings.Contains(log, "got 2") {
			t.Fatalf("the restored connection of an older cut carried data:\n%s", log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored connection neither failed nor worked within 45 s:\n%s", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("holder's log after the restore:\n%s", log)
	if strings.Contains(log, "timeout") {
		t.Fatalf("the restored connection timed out instead of failing cleanly:\n%s", log)
	}
	// A new connection works.
	out := td.sh(id, fmt.Sprintf(`python3 -c '
import socket
s = socket.create_connection((socket.gethostbyname("echo.test"), %d), timeout=10)
s.sendall(b"fresh\n"); print(s.recv(100).decode().strip())'`, echo.addr().Port()))
	if strings.TrimSpace(out) != "echo fresh" {
		t.Fatalf("a new connection after the restore: %q", out)
	}
}

// pingLedger asks the ledger at payments.test (port) for /ping from
// sandbox id, through the gateway's DNS and egress; it returns the answer.
func pingLedger(td *testDriver, id string, port uint16) string {
	return td.sh(id, fmt.Sprintf(`ip=$(nslookup payments.test %s | sed -n 's/^Address: *\(198\.[0-9.]*\)$/\1/p')
printf 'GET /ping HTTP/1.0\r\nHost: payments.test:%[2]d\r\n\r\n' | nc -w 10 $ip %[2]d`, egress.GatewayAddr, port))
}

// checkNetnsImage fails t unless image holds the network namespace as
// the driver records it (netnsimage.go): CRIU's images hold no link,
// address, route or netfilter table, image.json lists want among
// loopback's addresses and the default route through loopback.
func checkNetnsImage(t *testing.T, image, want string) {
	t.Helper()
	for _, pattern := range []string{"netdev-*.img", "ifaddr-*.img", "route-*.img", "iptables-*.img", "netns-ct-*.img"} {
		if m, _ := filepath.Glob(filepath.Join(image, imageCriuDir, pattern)); len(m) > 0 {
			t.Errorf("CRIU dumped the network namespace: %v", m)
		}
	}
	meta, err := readImageMeta(image)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Version != imageFormatVersion || meta.Netns == nil || !slices.Contains(meta.Netns.Loopback, want) || !meta.Netns.DefaultViaLoopback {
		t.Fatalf("image.json: version %d, netns %+v; want %d, %s on loopback and the default route through it", meta.Version, meta.Netns, imageFormatVersion, want)
	}
}

// TestRestoreImageWithDumpedNetns: an image made before the driver kept
// the network namespace out of CRIU's dump (format 2: CRIU dumped it, and
// image.json has no record of it) still restores, the namespace CRIU's,
// and the sandbox reaches the ledger through the gateway again.
func TestRestoreImageWithDumpedNetns(t *testing.T) {
	ledger := egresstest.NewLedger(t, true)
	path := egresstest.Start(t, map[string]netip.AddrPort{"payments.test": ledger.Addr()})
	td := newEgressDriver(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := newID("oldnetns")
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	path.StartRun(t, "t1", id, "run-0")
	if _, err := td.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "image")
	testDumpNetns = true
	_, err := td.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true})
	testDumpNetns = false
	if err != nil {
		t.Fatal(err)
	}
	meta, err := readImageMeta(image)
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(image, imageCriuDir, "netdev-*.img")); len(m) == 0 || meta.Version != imageFormatBlobs || meta.Netns != nil {
		t.Fatalf("old-format image: version %d, netns %+v, netdev images %v", meta.Version, meta.Netns, m)
	}
	if _, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	path.StartRun(t, "t1", id, "run-1")
	if out := pingLedger(td, id, ledger.Addr().Port()); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway after restoring an old-format image: %q", out)
	}
}
