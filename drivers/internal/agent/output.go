package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/agentproto"
)

// Output streams process pid's output from offset to fn, frame by frame,
// in order, each byte once: a stream that breaks is re-attached from the
// offset after the last byte fn was given (frames the agent sends again are
// trimmed). Rewound and Lost frames are passed to fn as they come, and the
// offset moves to theirs. With follow, it returns after the Exited frame
// (also given to fn); without, when the output so far is sent. fn's error
// ends the stream and is returned.
func (c *Client) Output(ctx context.Context, pid int, offset int64, follow bool, fn func(agentproto.Frame) error) error {
	q := url.Values{}
	if follow {
		q.Set("follow", "1")
	}
	var broke time.Time // when the stream first failed to (re)attach
	for {
		q.Set("offset", strconv.FormatInt(offset, 10))
		resp, err := c.do(ctx, "GET", "/v1/processes/"+strconv.Itoa(pid)+"/output", q, nil)
		if err == nil {
			var ended bool
			ended, offset, err = deliver(resp.Body, offset, fn)
			resp.Body.Close()
			if err == nil && (ended || !follow) {
				return nil
			}
			if err == nil {
				err = c.unavailable(errors.New("output stream ended early"))
			}
			var fe fnError
			if errors.As(err, &fe) {
				return fe.err
			}
			broke = time.Time{} // it was attached: a new window
		}
		if err := c.again(ctx, &broke, err); err != nil {
			return err
		}
	}
}

// fnError is the callback's own error, which ends a stream for good.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// deliver reads frames from body, passing on what lies at or after offset.
// It returns whether the exit frame came, the new offset, and the error that
// ended the read (nil at the body's clean end).
func deliver(body io.Reader, offset int64, fn func(agentproto.Frame) error) (bool, int64, error) {
	for {
		f, err := agentproto.ReadFrame(body)
		if err == io.EOF {
			return false, offset, nil
		}
		if err != nil {
			if errors.Is(err, agentproto.ErrFrame) {
				return false, offset, errdefs.DataLossf("agent output: %v", err)
			}
			return false, offset, errdefs.Unavailablef("agent output: %v", err)
		}
		switch f.Kind {
		case agentproto.Stdout, agentproto.Stderr:
			end := f.Offset + int64(len(f.Data))
			if end <= offset {
				continue // sent again after a re-attach
			}
			if f.Offset < offset {
				f.Data = f.Data[offset-f.Offset:]
				f.Offset = offset
			}
			if f.Offset > offset {
				return false, offset, errdefs.DataLossf("agent output: a gap from %d to %d", offset, f.Offset)
			}
			if err := fn(f); err != nil {
				return false, offset, fnError{err}
			}
			offset = end
		case agentproto.Rewound, agentproto.Lost:
			if err := fn(f); err != nil {
				return false, offset, fnError{err}
			}
			offset = f.Offset
		case agentproto.Exited:
			if err := fn(f); err != nil {
				return false, offset, fnError{err}
			}
			return true, offset, nil
		}
	}
}

// Exec runs a command to completion through the agent: start (base gives
// env, cwd, user; spec the rest), stdin streamed in, output streamed out to
// spec.Stdout and spec.Stderr, and its exit status. A program that is not
// there is exit status 127 (126: not executable) with the reason on stderr,
// as a shell reports it. A timeout is SIGKILL to the command's process group
// and TimedOut; a cancelled ctx kills it too and returns ctx's error.
func (c *Client) Exec(ctx context.Context, spec sandbox.ExecSpec, base agentproto.Start) (sandbox.ExitStatus, error) {
	s := base
	s.Args = spec.Args
	s.TTY = spec.TTY
	s.Hold = true // the output is streamed to the caller: none may be dropped
	s.Rows, s.Cols = spec.Size.Rows, spec.Size.Cols
	s.Stdin = spec.Stdin != nil
	if spec.Timeout > 0 {
		s.TimeoutMS = max(1, spec.Timeout.Milliseconds())
	}
	stdout, stderr := spec.Stdout, spec.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	var exit agentproto.Exit
	frame := func(f agentproto.Frame) error {
		switch f.Kind {
		case agentproto.Stdout:
			_, _ = stdout.Write(f.Data)
		case agentproto.Stderr:
			_, _ = stderr.Write(f.Data)
		case agentproto.Exited:
			exit, _ = f.Exit()
		case agentproto.Lost:
			// Only after 30 s without a reader (Start.Hold): say so, on
			// the stream the caller reads last.
			fmt.Fprintf(stderr, "\n[amber: %d bytes of output were lost]\n", f.LostBytes())
		}
		return nil
	}
	sctx, stopStdin := context.WithCancel(ctx)
	defer stopStdin()
	started := func(pid int) {
		if spec.Started != nil {
			spec.Started(pid)
		}
		if spec.Stdin != nil {
			go func() { _ = c.Stdin(sctx, pid, spec.Stdin, true) }()
		}
		if spec.TTY && spec.Resize != nil {
			go c.resizes(sctx, pid, spec.Resize)
		}
	}
	pid, off, ended, err := c.startAttached(ctx, s, started, frame)
	if err != nil && pid == 0 {
		var ae *Error
		if errors.As(err, &ae) && (ae.Code == "no_program" || ae.Code == "not_executable") {
			if spec.Stderr != nil && !spec.TTY {
				fmt.Fprintln(spec.Stderr, ae.Message)
			} else if spec.TTY && spec.Stdout != nil {
				fmt.Fprintln(spec.Stdout, ae.Message)
			}
			if ae.Code == "no_program" {
				return sandbox.ExitStatus{Code: 127}, nil
			}
			return sandbox.ExitStatus{Code: 126}, nil
		}
		return sandbox.ExitStatus{}, err
	}
	if err == nil && !ended { // the attached stream broke, or an old agent
		err = c.Output(ctx, pid, off, true, frame)
	}
	if err != nil {
		if ctx.Err() != nil {
			kctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
			_ = c.Signal(kctx, pid, int(syscall.SIGKILL), true)
			cancel()
			return sandbox.ExitStatus{}, fmt.Errorf("exec in %s: %w", c.id, ctx.Err())
		}
		return sandbox.ExitStatus{}, err
	}
	return sandbox.ExitStatus{Code: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut}, nil
}

// resizes passes a terminal's size changes on to process pid until ctx
// ends or ch closes.
func (c *Client) resizes(ctx context.Context, pid int, ch <-chan sandbox.WindowSize) {
	for {
		select {
		case <-ctx.Done():
			return
		case ws, ok := <-ch:
			if !ok {
				return
			}
			_ = c.Resize(ctx, pid, ws.Rows, ws.Cols)
		}
	}
}

// startAttached starts s and streams its output to fn in the same round
// trip (POST /v1/processes?attach=1), calling started with the pid before
// the first frame. It returns the pid and whether the exit frame came; if
// not, off is where Output goes on: the stream broke after the start (a
// checkpoint drops connections), or the agent predates attached starts
// and answered Started alone. A start that fails is retried under the same
// key as Start is, and returns pid 0; fn's error is returned with the pid.
func (c *Client) startAttached(ctx context.Context, s agentproto.Start, started func(int), fn func(agentproto.Frame) error) (pid int, off int64, ended bool, err error) {
	if s.Key == "" {
		s.Key = newKey()
	}
	body, err := json.Marshal(s)
	if err != nil {
		return 0, 0, false, err
	}
	var resp *http.Response
	for broke := (time.Time{}); ; {
		resp, err = c.do(ctx, "POST", "/v1/processes", url.Values{"attach": {"1"}}, bytes.NewReader(body))
		if err == nil {
			break
		}
		if err := c.again(ctx, &broke, err); err != nil {
			return 0, 0, false, err
		}
	}
	defer resp.Body.Close()
	if h := resp.Header.Get(agentproto.PIDHeader); h == "" { // an agent before 1.1
		var st agentproto.Started
		if err := json.NewDecoder(io.LimitReader(resp.Body, agentproto.MaxJSON)).Decode(&st); err != nil || st.PID <= 0 {
			return 0, 0, false, c.unavailable(fmt.Errorf("bad answer to a start: pid %d, %v", st.PID, err))
		}
		started(st.PID)
		return st.PID, 0, false, nil
	} else if pid, err = strconv.Atoi(h); err != nil || pid <= 0 {
		return 0, 0, false, c.unavailable(fmt.Errorf("start answered pid %q", h))
	}
	started(pid)
	ended, off, err = deliver(resp.Body, 0, fn)
	var fe fnError
	if errors.As(err, &fe) {
		return pid, off, false, fe.err
	}
	return pid, off, ended, nil // a broken stream is re-attached by the caller
}

// SandboxOutput is Output in the terms of sandbox.OutputReader: what a
// driver's Output method returns.
func (c *Client) SandboxOutput(ctx context.Context, pid int, offset int64, follow bool, fn func(sandbox.OutputFrame) error) error {
	return c.Output(ctx, pid, offset, follow, func(f agentproto.Frame) error {
		of := sandbox.OutputFrame{Kind: f.Kind.String(), Offset: f.Offset, Data: f.Data}
		switch f.Kind {
		case agentproto.Exited:
			e, _ := f.Exit()
			of.Exit = &sandbox.ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut}
			of.Data = nil
		case agentproto.Lost:
			of.Lost = f.LostBytes()
			of.Data = nil
		}
		return fn(of)
	})
}
