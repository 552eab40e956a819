package criu

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.PortDialer = (*Driver)(nil)

// DialPort implements sandbox.PortDialer: it connects to 127.0.0.1:port in
// the sandbox's network namespace (loopback only; the host cannot route to
// it). A goroutine of its own, locked to its thread, enters the namespace
// of the sandbox's init (/proc/<init pid>/ns/net) with setns, creates and
// connects the socket there, and returns to the daemon's namespace before
// it unlocks the thread. A socket keeps the namespace it was created in, so
// the connection stays inside the sandbox while the daemon uses it from any
// thread. If the thread cannot go back, it stays locked and dies with its
// goroutine (the Go runtime then discards it), so no other goroutine ever
// runs in the sandbox's namespace.
func (d *Driver) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.InvalidArgumentf("port %d is not in 1..65535", port)
	}
	ls, err := d.running(id)
	if err != nil {
		return nil, err
	}
	st, err := ls.c.State()
	if err != nil {
		return nil, recordErr(id, err)
	}
	pid := st.InitProcessPid
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: open network namespace of init %d: %w", id, pid, err)
	}
	defer ns.Close()
	// The pid could have been reused between State and Open: the init must
	// still be the same process now that its namespace is held open.
	if st2, err := ls.c.State(); err != nil || st2.InitProcessPid != pid || st2.InitProcessStartTime != st.InitProcessStartTime {
		return nil, errdefs.FailedPreconditionf("sandbox %s: its init changed while dialling", id)
	}

	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, err := dialInNetns(ctx, int(ns.Fd()), port)
		if err != errThreadTainted {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("sandbox %s: dial port %d: %w", id, port, r.err)
	}
	return r.c, nil
}

var errThreadTainted = fmt.Errorf("could not return the thread to the daemon's network namespace")

// dialInNetns runs on a locked thread: it enters netns fd, dials, and
// goes back. errThreadTainted means the thread must not be unlocked.
func dialInNetns(ctx context.Context, fd, port int) (net.Conn, error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("setns: %w", err)
	}
	var dl net.Dialer
	c, derr := dl.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		if c != nil {
			c.Close()
		}
		return nil, errThreadTainted
	}
	if derr != nil {
		return nil, derr
	}
	return c, nil
}
