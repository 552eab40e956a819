package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// The sandbox's control server: `runsc boot` serves gVisor's uRPC on a
// Unix socket, and every runsc subcommand that talks to a running sandbox
// (pause, resume, checkpoint, port-forward) is a process that connects to
// it, makes one call and exits. The driver makes those calls itself: a
// cut then starts no runsc process (it started four: state, pause,
// checkpoint, resume), and a port dial none (it started one per dial,
// among them the agent's after every restore). Each spawn of the 60 MB
// static runsc cost 10–50 ms on this machine's kind, most of it inside the
// frozen window.
//
// The wire (gvisor.dev/gvisor/pkg/urpc, on a SOCK_STREAM socket): the
// client writes one JSON object {"method": M, "arg": A}; files travel as
// SCM_RIGHTS with its first bytes, in the order the method expects. The
// server answers one JSON object {"success": bool, "err": string,
// "result": R}. One call per connection here.
const (
	ctlPause       = "containerManager.Pause"
	ctlResume      = "containerManager.Resume"
	ctlCheckpoint  = "containerManager.Checkpoint"
	ctlPortForward = "containerManager.PortForward"
	ctlWaitRestore = "containerManager.WaitRestore" // lazy.go
)

// controlTimeout bounds one control call when ctx has no earlier deadline;
// refusedWait how long a refused dial is tried again.
const (
	controlTimeout = 2 * time.Minute
	refusedWait    = 3 * time.Second
)

// saveOpts is the argument of containerManager.Checkpoint
// (pkg/sentry/control.SaveOpts; the files: state, page metadata, pages).
type saveOpts struct {
	Metadata      map[string]string `json:"metadata"`
	HavePagesFile bool              `json:"have_pages_file"`
	Resume        bool
}

// portForwardOpts is the argument of containerManager.PortForward
// (runsc/boot.PortForwardOpts; the file: one end of a stream socket the
// sentry connects to 127.0.0.1:Port of the sandbox's netstack).
type portForwardOpts struct {
	ContainerID string
	Port        uint16
}

// controlError is a call the control server answered with an error.
type controlError struct {
	method, msg string
}

func (e *controlError) Error() string { return e.method + ": " + e.msg }

// controlSocket is where runsc boot put sandbox id's control socket: the
// path runsc recorded in the container's state file
// (<root>/<cid>_sandbox:<sid>.state, "sandbox"."controlSocketPath"), else
// the first directory of runsc's own order (runsc/sandbox.
// createControlSocket) that holds runsc-<sandbox id>.sock. The state file
// comes first: a killed sandbox leaves its socket file behind, and the
// next sandbox of the same id, which cannot bind that name, makes its
// socket in the next directory of the order.
func (d *Driver) controlSocket(id string) (string, error) {
	rid := runtimeID(id)
	if b, err := os.ReadFile(filepath.Join(d.root, rid+"_sandbox:"+rid+".state")); err == nil {
		var st struct {
			Sandbox struct {
				ControlSocketPath string `json:"controlSocketPath"`
			} `json:"sandbox"`
		}
		if json.Unmarshal(b, &st) == nil && st.Sandbox.ControlSocketPath != "" {
			if fi, err := os.Stat(st.Sandbox.ControlSocketPath); err == nil && fi.Mode()&os.ModeSocket != 0 {
				return st.Sandbox.ControlSocketPath, nil
			}
		}
	}
	name := "runsc-" + rid + ".sock"
	for _, dir := range []string{d.root, "/var/run", "/run", "/tmp"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
			return p, nil
		}
	}
	return "", errdefs.FailedPreconditionf("sandbox %s: no control socket (is it running?)", id)
}

// dialControl connects to a socket at path of any length (sun_path holds
// 107 bytes; a longer path is reached through an O_PATH descriptor, as
// runsc does).
func dialControl(ctx context.Context, path string) (*net.UnixConn, error) {
	addr := path
	if len(path) >= 108 {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		defer unix.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// control makes one call to sandbox id's control server, passing files
// (which stay the caller's to close). An answer that is an error is a
// *controlError; anything else (no socket, a broken connection) is the
// sandbox not answering.
func (d *Driver) control(ctx context.Context, id, method string, arg any, files ...*os.File) error {
	d.mu.Lock()
	d.calls["ctl:"+method]++
	d.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, controlTimeout)
		defer cancel()
	}
	path, err := d.controlSocket(id)
	if err != nil {
		return err
	}
	// runsc binds the socket before it starts the sandbox, which listens
	// on it once it runs: right after a create or a restore a dial can be
	// refused for a moment. A refusal that lasts is Unavailable (a sandbox
	// that died keeps its socket file until runsc's state is removed).
	var c *net.UnixConn
	for wait := time.Now().Add(refusedWait); ; {
		if c, err = dialControl(ctx, path); err == nil {
			break
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			return fmt.Errorf("sandbox %s: control socket: %w", id, err)
		}
		if time.Now().After(wait) || sleepCtx(ctx, 20*time.Millisecond) != nil {
			return fmt.Errorf("sandbox %s: control socket: %w: %w", id, err, errdefs.ErrUnavailable)
		}
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req, err := json.Marshal(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, arg})
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(req, oob, nil)
	runtime.KeepAlive(files)
	if err == nil && n < len(req) {
		_, err = c.Write(req[n:])
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: %s: %w", id, method, err)
	}

	// The answer; descriptors that come with its first byte are not
	// wanted by any call made here.
	first := make([]byte, 1)
	rights := make([]byte, unix.CmsgSpace(16*4))
	n, oobn, _, _, err := c.ReadMsgUnix(first, rights)
	if oobn > 0 {
		closeRights(rights[:oobn])
	}
	if err != nil || n == 0 {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("sandbox %s: %s: no answer: %w", id, method, err)
	}
	var res struct {
		Success bool            `json:"success"`
		Err     string          `json:"err"`
		Result  json.RawMessage `json:"result"`
	}
	if err := json.NewDecoder(io.MultiReader(bytes.NewReader(first), c)).Decode(&res); err != nil {
		return fmt.Errorf("sandbox %s: %s: answer: %w", id, method, err)
	}
	if !res.Success {
		return &controlError{method: method, msg: res.Err}
	}
	return nil
}

// closeRights closes the descriptors of SCM_RIGHTS control messages.
func closeRights(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if fds, err := unix.ParseUnixRights(&m); err == nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
}

// controlDown reports whether err means the control server did not
// answer at all (no socket, refused, reset): the sandbox is not running.
func controlDown(err error) bool {
	var ce *controlError
	return err != nil && !errors.As(err, &ce)
}
