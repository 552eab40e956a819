package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.PortDialer = (*Driver)(nil)

// dialTimeout bounds one DialPort when ctx has no earlier deadline.
const dialTimeout = 30 * time.Second

// DialPort implements sandbox.PortDialer through the sentry's port
// forwarding (what `runsc port-forward --stream` asks for).
//
// The sandbox's network is gVisor's netstack inside the sentry: the host,
// even inside the sandbox's network namespace, has nothing to dial. The
// driver passes one end of a Unix socket pair to the sentry over its
// control socket, and the sentry connects it to 127.0.0.1:port of the
// sandbox's netstack, copying between the two (the call fails if nothing
// listens). The other end is the connection; closing it ends the sentry's
// copy. No process runs, inside the sandbox or on the host, and no port is
// opened on the host.
func (d *Driver) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.InvalidArgumentf("port %d is not in 1..65535", port)
	}
	rec, err := d.running(id)
	if err != nil {
		return nil, err
	}
	// Like the agent's: not while the sandbox is cut, and closed before a
	// cut (gVisor cannot save a port-forward proxy; see holdAgentDials).
	release, err := d.agentDial(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	c, err := d.dialPort(ctx, rec, port)
	if err != nil {
		return nil, err
	}
	pc := &portConn{Conn: c, d: d, id: id}
	d.mu.Lock()
	if d.portConns[id] == nil {
		d.portConns[id] = map[*portConn]struct{}{}
	}
	d.portConns[id][pc] = struct{}{}
	d.mu.Unlock()
	return pc, nil
}

// portConn is a connection DialPort handed out. A checkpoint closes it
// (closePortConns): a connection from outside does not survive a restore
// under gVisor anyway (Capabilities.LiveOutsideTCP is false), and an open
// one would make the save fail.
type portConn struct {
	net.Conn
	d    *Driver
	id   string
	once sync.Once
}

func (c *portConn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		delete(c.d.portConns[c.id], c)
		if len(c.d.portConns[c.id]) == 0 {
			delete(c.d.portConns, c.id)
		}
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}

// closePortConns closes every DialPort connection into sandbox id and
// returns how many there were.
func (d *Driver) closePortConns(id string) int {
	d.mu.Lock()
	var cs []*portConn
	for c := range d.portConns[id] {
		cs = append(cs, c)
	}
	d.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}

// dialPort is DialPort for rec in any phase (the agent's client dials
// while Create and Restore wait for the agent, before the record says
// created): one end of a new socket pair goes to the sentry with a
// containerManager.PortForward call on the control socket (what `runsc
// port-forward --stream` sends), and the sentry connects it to
// 127.0.0.1:port of the sandbox's netstack; the other end is the
// connection. No process is started.
func (d *Driver) dialPort(ctx context.Context, rec *record, port int) (net.Conn, error) {
	id := rec.ID
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: port forward socket pair: %w", id, err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "port-forward"), os.NewFile(uintptr(fds[1]), "port-forward-sentry")
	defer theirs.Close()
	err = d.control(ctx, id, ctlPortForward, &portForwardOpts{ContainerID: runtimeID(id), Port: uint16(port)}, theirs)
	if err != nil {
		ours.Close()
		return nil, d.portForwardError(id, port, err)
	}
	c, err := net.FileConn(ours)
	ours.Close() // FileConn holds a dup
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: port forward: %w", id, err)
	}
	return c, nil
}

// portForwardError explains a failed port-forward call.
func (d *Driver) portForwardError(id string, port int, err error) error {
	var ce *controlError
	switch {
	case errors.Is(err, errdefs.ErrUnavailable):
		return fmt.Errorf("sandbox %s: dial port %d: %w", id, port, err)
	case controlDown(err):
		return fmt.Errorf("sandbox %s is not running: %w: %v", id, errdefs.ErrFailedPrecondition, err)
	case errors.As(err, &ce) && strings.Contains(ce.msg, "refused"):
		return fmt.Errorf("sandbox %s: dial port %d: connection refused: %w", id, port, errors.Join(errdefs.ErrFailedPrecondition, err))
	}
	return fmt.Errorf("sandbox %s: dial port %d: %w", id, port, err)
}
