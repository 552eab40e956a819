package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/amber-run/amber/lib/netns"
)

// Server is what a Network hands connections to: the gateway.
type Server interface {
	NameRecorder
	// ServeConnTo serves one connection from sandbox, whose original
	// destination was origDst (host: the name it resolved it from, or "").
	ServeConnTo(ctx context.Context, conn net.Conn, origDst netip.AddrPort, host, sandbox string) error
}

// Network is a node's egress plumbing: one gateway namespace, veth pair and
// pair of daemon sockets per sandbox. It implements the drivers' network
// hook (sandbox.Network). Safe for concurrent use.
type Network struct {
	dir    string
	server Server
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu  sync.Mutex
	sbs map[string]*attachment
}

type attachment struct {
	server Server
	tl     *net.TCPListener
	uc     *net.UDPConn
	names  *names
	wg     sync.WaitGroup

	connsMu sync.Mutex
	conns   map[*net.TCPConn]struct{} // accepted, being served
}

// New returns a Network pinning gateway namespaces under dir and serving
// connections with server. server may be nil when the Network must exist
// before the gateway does (drivers are made first); SetServer must then be
// called before any sandbox is plumbed.
func New(dir string, server Server, log *slog.Logger) (*Network, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Network{dir: dir, server: server, log: log, ctx: ctx, cancel: cancel, sbs: map[string]*attachment{}}, nil
}

// SetServer sets the server connections are handed to (see New).
func (n *Network) SetServer(s Server) {
	n.mu.Lock()
	n.server = s
	n.mu.Unlock()
}

// GatewayNetns is where sandbox id's gateway namespace is pinned.
func (n *Network) GatewayNetns(id string) string { return filepath.Join(n.dir, id+".netns") }

// Plumb connects sandbox id's namespace (pinned at sbxNS) to the gateway
// and starts serving it. Drivers call it after they make the namespace and
// before the sandbox starts, on create and on restore.
func (n *Network) Plumb(_ context.Context, id, sbxNS string) error {
	if err := Plumb(sbxNS, n.GatewayNetns(id)); err != nil {
		return err
	}
	return n.Listen(id)
}

// Listen starts serving sandbox id if it is not served yet; its gateway
// namespace must exist (a daemon restarted while the sandbox ran calls it).
func (n *Network) Listen(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.sbs[id]; ok {
		return nil
	}
	if n.server == nil {
		return fmt.Errorf("egress: no gateway to serve sandbox %s (SetServer)", id)
	}
	gw := n.GatewayNetns(id)
	if !netns.Pinned(gw) {
		return fmt.Errorf("egress: sandbox %s is not plumbed (%s)", id, gw)
	}
	tl, uc, err := listen(gw)
	if err != nil {
		return err
	}
	a := &attachment{server: n.server, tl: tl, uc: uc, names: newNames(id, n.server), conns: map[*net.TCPConn]struct{}{}}
	n.sbs[id] = a
	a.wg.Add(2)
	go func() { defer a.wg.Done(); serveDNS(n.ctx, uc, a.names, n.log) }()
	go func() { defer a.wg.Done(); n.accept(id, a) }()
	return nil
}

// accept hands every connection of sandbox id to the server.
func (n *Network) accept(id string, a *attachment) {
	for {
		c, err := a.tl.AcceptTCP()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				n.log.Warn("egress: accept", "sandbox", id, "err", err)
			}
			return
		}
		a.connsMu.Lock()
		a.conns[c] = struct{}{}
		a.connsMu.Unlock()
		go func() {
			defer func() {
				a.connsMu.Lock()
				delete(a.conns, c)
				a.connsMu.Unlock()
			}()
			dst, err := OriginalDst(c)
			if err != nil {
				n.log.Warn("egress: connection without an original destination; closed", "sandbox", id, "err", err)
				c.Close()
				return
			}
			host := ""
			if StandIns.Contains(dst.Addr()) {
				host, _ = a.names.name(n.ctx, dst.Addr())
			}
			if err := a.server.ServeConnTo(n.ctx, c, dst, host, id); err != nil {
				n.log.Debug("egress: connection ended", "sandbox", id, "dest", dst, "host", host, "err", err)
			}
		}()
	}
}

// stop closes sandbox id's sockets (its open connections are reset by the
// kernel once their goroutines close them).
func (n *Network) stop(id string) {
	n.mu.Lock()
	a := n.sbs[id]
	delete(n.sbs, id)
	n.mu.Unlock()
	if a == nil {
		return
	}
	a.tl.Close()
	a.uc.Close()
	a.wg.Wait()
}

// ResetConnections resets every connection of sandbox id: the sandbox's end
// gets a reset (if it is there to get one) and the gateway closes the
// upstream end, so the outside sees the connection close. The engine calls
// it when the sandbox's side of its connections is gone for good (killed,
// crashed, or about to be restored from a cut other than the one it was
// stopped at); a restored TCP endpoint that talks to a reset connection
// gets a reset from the kernel, never a hang. A planned
// checkpoint-and-stop and restore of that same cut keeps them.
func (n *Network) ResetConnections(id string) int {
	n.mu.Lock()
	a := n.sbs[id]
	n.mu.Unlock()
	if a == nil {
		return 0
	}
	a.connsMu.Lock()
	defer a.connsMu.Unlock()
	for c := range a.conns {
		c.SetLinger(0) // RST, not FIN: the sandbox's state is gone
		c.Close()
	}
	return len(a.conns)
}

// Unplumb stops serving sandbox id and removes its gateway namespace (and
// with it the veth pair). Drivers call it when the sandbox is destroyed.
func (n *Network) Unplumb(_ context.Context, id string) error {
	n.stop(id)
	return Unplumb(n.GatewayNetns(id))
}

// Attached lists the sandboxes being served.
func (n *Network) Attached() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.sbs))
	for id := range n.sbs {
		out = append(out, id)
	}
	return out
}

// Close stops serving every sandbox; their namespaces stay (a daemon that
// starts again serves them with Listen).
func (n *Network) Close() error {
	n.mu.Lock()
	ids := make([]string, 0, len(n.sbs))
	for id := range n.sbs {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	for _, id := range ids {
		n.stop(id)
	}
	n.cancel()
	return nil
}
