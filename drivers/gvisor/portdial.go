package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.PortDialer = (*Driver)(nil)

// dialTimeout bounds one DialPort when ctx has no earlier deadline.
const dialTimeout = 30 * time.Second

// DialPort implements sandbox.PortDialer with `runsc port-forward --stream`.
//
// The sandbox's network is gVisor's netstack inside the sentry: the host,
// even inside the sandbox's network namespace, has nothing to dial. runsc's
// stream mode connects to a Unix socket we listen on (in a private
// directory of the daemon, mode 0700), passes that connection's descriptor
// to the sentry over its control socket, and the sentry connects it to
// 127.0.0.1:port of the sandbox's netstack, copying between the two. runsc
// exits once the sentry has connected (or failed to: nothing listens, and
// its error is returned). The accepted end of the Unix socket is the
// connection; closing it ends the sentry's copy. No process runs inside the
// sandbox for it, and no port is opened on the host.
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
// created).
func (d *Driver) dialPort(ctx context.Context, rec *record, port int) (net.Conn, error) {
	id := rec.ID
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	// A directory of its own keeps the socket's path short (108 bytes) and
	// reachable by root only.
	dir, err := os.MkdirTemp("", "amber-pf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: port forward socket: %w", id, err)
	}
	defer ln.Close()
	ln.SetUnlinkOnClose(true)

	var stderr bytes.Buffer
	cmd := d.command(ctx, append(d.globalFlags(rec, ""), "port-forward", "--stream", path, runtimeID(id), strconv.Itoa(port))...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox %s: runsc port-forward: %w", id, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	type accepted struct {
		c   *net.UnixConn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.AcceptUnix()
		acc <- accepted{c, err}
	}()
	var conn *net.UnixConn
	fail := func(err error) (net.Conn, error) {
		if conn != nil {
			conn.Close()
		}
		ln.Close() // ends a pending Accept
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
		<-done
		return nil, err
	}
	// runsc connects first, then asks the sentry; it exits when the sentry
	// has answered. Both must happen, in either order of our noticing.
	var runErr error
	exited := false
	for conn == nil || !exited {
		select {
		case a := <-acc:
			if a.err != nil {
				return fail(fmt.Errorf("sandbox %s: port forward accept: %w", id, a.err))
			}
			conn = a.c
			acc = nil
		case runErr = <-done:
			exited = true
			done <- runErr // for fail
			if runErr != nil {
				return fail(d.portForwardError(id, port, runErr, stderr.String()))
			}
			if conn == nil {
				// runsc succeeded, so it connected before it exited: the
				// connection is in the backlog.
				select {
				case a := <-acc:
					if a.err != nil {
						return fail(fmt.Errorf("sandbox %s: port forward accept: %w", id, a.err))
					}
					conn = a.c
				case <-time.After(5 * time.Second):
					return fail(fmt.Errorf("sandbox %s: runsc port-forward exited without connecting", id))
				}
			}
			<-done
		case <-ctx.Done():
			return fail(fmt.Errorf("sandbox %s: dial port %d: %w", id, port, ctx.Err()))
		}
	}
	return conn, nil
}

// portForwardError explains a failed runsc port-forward.
func (d *Driver) portForwardError(id string, port int, err error, stderr string) error {
	msg := strings.TrimSpace(stderr)
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:]
	}
	re := &runscError{args: []string{"port-forward"}, err: err, msg: msg}
	switch {
	case strings.Contains(msg, "refused"):
		return fmt.Errorf("sandbox %s: dial port %d: connection refused: %w", id, port, errors.Join(errdefs.ErrFailedPrecondition, re))
	}
	return classify(id, re)
}
