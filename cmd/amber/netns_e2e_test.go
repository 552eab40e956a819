package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// A test network of namespaces, so that a node can be cut off as well as
// killed.
//
//	host netns          hub netns (amber-e2e-…-hub)          node netns (one per node)
//	127.0.0.1:5432  ◀── forwarder on 10.213.0.1:P  ─┐
//	127.0.0.1:MinIO ◀── forwarder on 10.213.0.1:Q  ─┤ br0 10.213.0.1/24
//	127.0.0.1:R     ──▶ dialled from the hub ───────┤   ├─ vh-1 ◀─veth─▶ vn-1 10.213.0.11 (amber up)
//	 (the test's CLI and client reach node 1)       │   └─ vh-2 ◀─veth─▶ vn-2 10.213.0.12 (amber up)
//
// Every node listens on, and advertises, its own address on the bridge, so
// inter-node forwarding goes over it. The stores the nodes share
// (PostgreSQL, MinIO) stay on the host's loopback: the test process runs TCP
// forwarders whose listening sockets it opened inside the hub, and which
// dial the stores from the host's namespace. The test reaches a node's API
// through a forwarder the other way round: a listener on the host's
// loopback whose connections are dialled from inside the hub. Cut takes a
// node's hub-side veth down: its packets go nowhere (nothing is refused, as
// behind a real partition), to the stores, to the other nodes and from the
// test alike; Heal brings it back up.
//
// The subnet exists only inside the namespaces the test made, so it cannot
// clash with the host's routes; every name carries a random suffix, so two
// runs on one machine do not meet.
type testNet struct {
	t      *testing.T
	tag    string // random, in every pinned namespace's name
	hub    string // pinned hub namespace
	hubIP  netip.Addr
	nodes  []*netNode
	mu     sync.Mutex
	closed bool
	lns    []net.Listener
	conns  map[net.Conn]bool
}

// netNode is one node's namespace and link.
type netNode struct {
	name string     // the node's id
	ns   string     // pinned namespace path
	ip   netip.Addr // its address on the bridge
	hub  string     // its veth's end in the hub (cut and healed there)
}

const (
	testNetPrefix = "10.213.0" // /24 inside the test's namespaces only
	testBridge    = "br0"
)

// newTestNet makes the hub namespace and its bridge. Everything it and
// addNode make goes in t.Cleanup: forwarders closed, links deleted,
// namespaces unpinned.
func newTestNet(t *testing.T) *testNet {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	n := &testNet{t: t, tag: hex.EncodeToString(b[:]), hubIP: netip.MustParseAddr(testNetPrefix + ".1"), conns: map[net.Conn]bool{}}
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		t.Fatal(err)
	}
	n.hub = filepath.Join("/run/netns", "amber-e2e-"+n.tag+"-hub")
	if err := nsCreate(n.hub); err != nil {
		t.Fatalf("this test needs root to make network namespaces: %v", err)
	}
	t.Cleanup(n.close)
	err := n.in(n.hub, func(h *netlink.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: testBridge}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		if err := h.AddrAdd(br, &netlink.Addr{IPNet: ipNet(n.hubIP)}); err != nil {
			return fmt.Errorf("address the bridge: %w", err)
		}
		return h.LinkSetUp(br)
	})
	if err != nil {
		t.Fatalf("test network: %v", err)
	}
	return n
}

func ipNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}
}

// in runs fn with a netlink handle on the namespace pinned at path.
func (n *testNet) in(path string, fn func(h *netlink.Handle) error) error {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

// addNode makes node name's namespace, with a veth to the bridge and the
// next address of the subnet.
func (n *testNet) addNode(name string) *netNode {
	t := n.t
	t.Helper()
	i := len(n.nodes) + 1
	nn := &netNode{name: name, ns: filepath.Join("/run/netns", fmt.Sprintf("amber-e2e-%s-%d", n.tag, i)),
		ip: netip.MustParseAddr(fmt.Sprintf("%s.%d", testNetPrefix, 10+i)), hub: fmt.Sprintf("vh-%d", i)}
	if err := nsCreate(nn.ns); err != nil {
		t.Fatalf("namespace of %s: %v", name, err)
	}
	n.nodes = append(n.nodes, nn)
	inner := fmt.Sprintf("vn-%d", i)
	err := n.in(n.hub, func(h *netlink.Handle) error {
		target, err := vnetns.GetFromPath(nn.ns)
		if err != nil {
			return err
		}
		defer target.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nn.hub}, PeerName: inner, PeerNamespace: netlink.NsFd(int(target))}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", nn.hub, err)
		}
		br, err := h.LinkByName(testBridge)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(veth, br); err != nil {
			return fmt.Errorf("attach %s to the bridge: %w", nn.hub, err)
		}
		return h.LinkSetUp(veth)
	})
	if err == nil {
		err = n.in(nn.ns, func(h *netlink.Handle) error {
			l, err := h.LinkByName(inner)
			if err != nil {
				return err
			}
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(nn.ip)}); err != nil {
				return fmt.Errorf("address %s: %w", inner, err)
			}
			return h.LinkSetUp(l)
		})
	}
	if err != nil {
		t.Fatalf("link of %s: %v", name, err)
	}
	return nn
}

// setLink takes node nn's link down (cut) or up (heal), at its hub end.
func (n *testNet) setLink(nn *netNode, up bool) {
	n.t.Helper()
	err := n.in(n.hub, func(h *netlink.Handle) error {
		l, err := h.LinkByName(nn.hub)
		if err != nil {
			return err
		}
		if up {
			return h.LinkSetUp(l)
		}
		return h.LinkSetDown(l)
	})
	if err != nil {
		n.t.Fatalf("set the link of %s up=%v: %v", nn.name, up, err)
	}
}

// Cut cuts node nn off the network; Heal reconnects it.
func (n *testNet) Cut(nn *netNode)  { n.setLink(nn, false) }
func (n *testNet) Heal(nn *netNode) { n.setLink(nn, true) }

// forwardToHost listens inside the hub, on the bridge's address, and
// forwards each connection to target on the host's loopback; it returns the
// address the nodes dial.
func (n *testNet) forwardToHost(target string) string {
	n.t.Helper()
	var ln net.Listener
	err := nsDo(n.hub, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(n.hubIP.String(), "0"))
		return err
	})
	if err != nil {
		n.t.Fatalf("forwarder in the hub: %v", err)
	}
	n.serve(ln, func() (net.Conn, error) { return net.DialTimeout("tcp", target, 10*time.Second) })
	return ln.Addr().String()
}

// forwardToNode listens on the host's loopback and forwards each
// connection to addr, dialled from inside the hub; it returns the address
// the test dials.
func (n *testNet) forwardToNode(addr string) string {
	n.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.t.Fatal(err)
	}
	n.serve(ln, func() (c net.Conn, err error) {
		err = nsDo(n.hub, func() (err error) {
			c, err = net.DialTimeout("tcp", addr, 10*time.Second)
			return err
		})
		return c, err
	})
	return ln.Addr().String()
}

// serve accepts on ln until the network closes and copies each connection
// to one dial makes, both ways.
func (n *testNet) serve(ln net.Listener, dial func() (net.Conn, error)) {
	n.mu.Lock()
	n.lns = append(n.lns, ln)
	n.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go n.pipe(c, dial)
		}
	}()
}

func (n *testNet) pipe(c net.Conn, dial func() (net.Conn, error)) {
	up, err := dial()
	if err != nil {
		c.Close()
		n.mu.Lock()
		if !n.closed && !errors.Is(err, syscall.ECONNREFUSED) { // refused: a node not up yet
			n.t.Logf("test network: forward %s: %v", c.LocalAddr(), err)
		}
		n.mu.Unlock()
		return
	}
	if !n.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
	n.untrack(c, up)
}

func (n *testNet) track(cs ...net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		n.conns[c] = true
	}
	return true
}

func (n *testNet) untrack(cs ...net.Conn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(n.conns, c)
	}
}

// close closes the forwarders and their connections, deletes the links
// (a veth goes with either end) and unpins every namespace.
func (n *testNet) close() {
	n.mu.Lock()
	n.closed = true
	for _, ln := range n.lns {
		ln.Close()
	}
	for c := range n.conns {
		c.Close()
	}
	n.mu.Unlock()
	err := n.in(n.hub, func(h *netlink.Handle) error {
		var errs []error
		for _, nn := range n.nodes {
			if l, err := h.LinkByName(nn.hub); err == nil {
				errs = append(errs, h.LinkDel(l))
			}
		}
		if l, err := h.LinkByName(testBridge); err == nil {
			errs = append(errs, h.LinkDel(l))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		n.t.Errorf("delete the test network's links: %v", err)
	}
	for _, nn := range n.nodes {
		if err := nsRemove(nn.ns); err != nil {
			n.t.Errorf("remove namespace %s: %v", nn.ns, err)
		}
	}
	if err := nsRemove(n.hub); err != nil {
		n.t.Errorf("remove namespace %s: %v", n.hub, err)
	}
}

// The test moves threads between namespaces and back, and never lets one
// end (lib/netns, made for the daemon, lets its threads die instead):
// a child started with Pdeathsig — miniotest's MinIO — is killed when the
// thread that forked it exits, and any thread of the test may be that one.

// nsCreate makes a network namespace pinned at path (in /run/netns, so
// `ip netns` lists it), with loopback up.
func nsCreate(path string) error {
	name := filepath.Base(path)
	if filepath.Dir(path) != "/run/netns" {
		return fmt.Errorf("namespace %s: the test pins namespaces in /run/netns", path)
	}
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// nsRemove unpins the namespace at path.
func nsRemove(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "del", filepath.Base(path)).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del: %v: %s", err, out)
	}
	return nil
}

// nsDo runs fn on a thread inside the namespace pinned at path, then moves
// the thread back to the test's namespace. Sockets fn opens stay in the
// namespace for their whole life; a process fn starts is born there.
func nsDo(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		err = fn()
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and ends with this goroutine
		errc <- err
	}()
	return <-errc
}

// reach rewrites the shared flags (sharedStores) so that --store and
// --blobs name the hub's forwarders to the host's PostgreSQL and MinIO.
func (n *testNet) reach(shared []string) []string {
	n.t.Helper()
	out := append([]string{}, shared...)
	for i := 0; i+1 < len(out); i++ {
		if out[i] != "--store" && out[i] != "--blobs" {
			continue
		}
		u, err := url.Parse(out[i+1])
		if err != nil || u.Host == "" {
			n.t.Fatalf("%s %q: the test network forwards only host:port URLs", out[i], out[i+1])
		}
		host := u.Hostname()
		if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
			n.t.Fatalf("%s %q: the test network forwards only to the host's loopback", out[i], out[i+1])
		}
		u.Host = n.forwardToHost(u.Host)
		out[i+1] = u.String()
	}
	return out
}

// startNode starts node id (in dir/id, with the shared flags as reach
// rewrote them and env added to its environment) inside a namespace of its
// own, listening on and advertising its address on the bridge. The test's
// CLI and client reach it through a forwarder on the host's loopback
// (testNode.addr). Its sandboxes are destroyed when the test ends.
func (n *testNet) startNode(bin, dir, id, adminKey string, shared, env []string) (*testNode, *netNode) {
	t := n.t
	t.Helper()
	nn := n.addNode(id)
	ndir := nodeDir(t, dir, id, adminKey)
	listen := net.JoinHostPort(nn.ip.String(), "7070")
	d := &daemon{t: t, bin: bin, dataDir: ndir, addr: n.forwardToNode(listen), logPath: filepath.Join(ndir, fmt.Sprintf("up-%d.log", time.Now().UnixNano()))}
	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"up", "--data-dir", ndir, "--addr", listen, "--driver", enginetest.DriverName()}, shared...)
	d.cmd = exec.Command(bin, append(args, "--node-id", id)...)
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// Started from a thread inside the node's namespace: the child is
	// born there (and nothing else of it changes: same mounts, cgroups).
	if err := nsDo(nn.ns, d.cmd.Start); err != nil {
		t.Fatalf("start %s in its namespace: %v", id, err)
	}
	d.pid, d.exited = d.cmd.Process.Pid, make(chan struct{})
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(syscall.SIGKILL) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, tail(d.log(), 80))
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + d.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("amber up (%s) exited: %v\n%s", id, d.cmd.ProcessState, d.log())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("amber up (%s) did not answer within 90s\n%s", id, d.log())
		}
	}
	cl, err := client.New(d.addr, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{daemon: d, id: id, cl: cl}, nn
}

// lingering lists what a test network with tag left behind (for the
// tests of this file: they check that cleanup removed everything).
func lingering(tag string) []string {
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.Contains(e.Name(), tag) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestNetnsForwarding checks the test network itself, without amber: a
// server on the host's loopback is reached from a node's namespace through
// the hub, a server in a node's namespace is reached from the host through
// its forwarder and from the other node over the bridge; a cut node
// reaches nothing and nothing reaches it, until healed; cleanup leaves no
// namespace behind.
func TestNetnsForwarding(t *testing.T) {
	if testing.Short() {
		t.Skip("makes network namespaces; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	var tag string
	t.Run("net", func(t *testing.T) {
		n := newTestNet(t)
		tag = n.tag
		a, b := n.addNode("a"), n.addNode("b")
		hostSrv := echoServer(t, func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
		viaHub := n.forwardToHost(hostSrv)
		aSrv := echoServer(t, func() (ln net.Listener, err error) {
			err = nsDo(a.ns, func() error { ln, err = net.Listen("tcp", net.JoinHostPort(a.ip.String(), "7070")); return err })
			return ln, err
		})
		toA := n.forwardToNode(aSrv)
		dialIn := func(nn *netNode, addr string) error {
			return nsDo(nn.ns, func() error { return echo(addr) })
		}
		if err := dialIn(a, viaHub); err != nil {
			t.Fatalf("node a to the host's loopback through the hub: %v", err)
		}
		if err := echo(toA); err != nil {
			t.Fatalf("host to node a through its forwarder: %v", err)
		}
		if err := dialIn(b, aSrv); err != nil {
			t.Fatalf("node b to node a over the bridge: %v", err)
		}
		n.Cut(a)
		if err := dialIn(a, viaHub); err == nil {
			t.Fatal("a cut node reached the host")
		}
		if err := dialIn(b, aSrv); err == nil {
			t.Fatal("node b reached a cut node")
		}
		if err := echo(toA); err == nil {
			t.Fatal("the host reached a cut node")
		}
		n.Heal(a)
		if err := dialIn(b, aSrv); err != nil {
			t.Fatalf("node b to node a once healed: %v", err)
		}
	})
	if left := lingering(tag); len(left) > 0 {
		t.Fatalf("namespaces left behind: %v", left)
	}
}

// echoServer serves an echo on the listener listen opens.
func echoServer(t *testing.T, listen func() (net.Listener, error)) string {
	ln, err := listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// echo sends a line to the echo server at addr and checks the answer,
// within 3 seconds.
func echo(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping\n" {
		return fmt.Errorf("echo answered %q", buf)
	}
	return nil
}
