package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Processes lists the processes of sandbox id.
func (c *Client) Processes(ctx context.Context, id string) ([]api.Process, error) {
	var out api.ProcessList
	return out.Processes, c.do(ctx, "GET", sbPath(id, "/processes"), nil, nil, &out)
}

// StartProcess starts a background process and returns its PID.
func (c *Client) StartProcess(ctx context.Context, id string, r api.StartProcessRequest) (int, error) {
	var out api.StartProcessResponse
	return out.PID, c.do(ctx, "POST", sbPath(id, "/processes"), nil, r, &out)
}

// WriteStdin sends r to the stdin of background process pid (started with
// Stdin: true); closeAfter closes its stdin after r, so it reads end of
// file.
func (c *Client) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	var q url.Values
	if closeAfter {
		q = url.Values{"close": {"true"}}
	}
	if r == nil {
		r = bytesReader(nil)
	}
	req, err := c.request(ctx, "POST", sbPath(id, fmt.Sprintf("/processes/%d/stdin", pid)), q, r, "application/octet-stream")
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Signal sends signal (a name like "TERM" or a number) to process pid.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	return c.do(ctx, "POST", sbPath(id, fmt.Sprintf("/processes/%d/signal", pid)), nil, api.SignalRequest{Signal: signal}, nil)
}

// Wait waits until background process pid of sandbox id has ended and
// returns how it ended. It blocks for as long as the process runs; cancel
// ctx to stop waiting (the process runs on). Calling it again, or after
// the end, returns the same status.
func (c *Client) Wait(ctx context.Context, id string, pid int) (api.ExitStatus, error) {
	var out api.ExitStatus
	err := c.do(ctx, "POST", sbPath(id, fmt.Sprintf("/processes/%d/wait", pid)), nil, nil, &out)
	if err != nil && ctx.Err() != nil {
		// Not the daemon's failure: the caller stopped waiting.
		return out, fmt.Errorf("wait for process %d in %s: %w", pid, id, ctx.Err())
	}
	return out, err
}

// ProcessOutput streams process pid's output from offset (see
// api.OutputFrame) to fn. With follow it returns after the "exited" frame;
// a stream that breaks — a dropped connection, a daemon restart, a restore —
// is opened again from the offset after the last byte fn got, so fn sees
// each byte once. It gives up when ctx ends, on an error other than
// "unavailable", and on "failed precondition" (the sandbox is being
// restored, or stopped) that lasts longer than a minute. fn's error ends
// the stream and is returned.
func (c *Client) ProcessOutput(ctx context.Context, id string, pid int, offset int64, follow bool, fn func(api.OutputFrame) error) error {
	var stoppedSince time.Time
	for attempt := 0; ; attempt++ {
		ended, next, err := c.outputOnce(ctx, id, pid, offset, follow, fn)
		offset = next
		if err == nil && (ended || !follow) {
			return nil
		}
		var fe outputFnError
		if errors.As(err, &fe) {
			return fe.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err == nil, errors.Is(err, errdefs.ErrUnavailable):
			stoppedSince = time.Time{}
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			if stoppedSince.IsZero() {
				stoppedSince = time.Now()
			} else if time.Since(stoppedSince) > time.Minute {
				return err
			}
		default:
			return err
		}
		// Broken or cut short: open it again from where it stopped.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
		}
	}
}

type outputFnError struct{ err error }

func (e outputFnError) Error() string { return e.err.Error() }

// outputOnce reads one output stream; it returns whether "exited" came and
// the offset to go on from.
func (c *Client) outputOnce(ctx context.Context, id string, pid int, offset int64, follow bool, fn func(api.OutputFrame) error) (bool, int64, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "true")
	}
	req, err := c.request(ctx, "GET", sbPath(id, fmt.Sprintf("/processes/%d/output", pid)), q, nil, "")
	if err != nil {
		return false, offset, err
	}
	resp, err := c.send(req)
	if err != nil {
		return false, offset, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.OutputFrame
		if err := dec.Decode(&f); err != nil {
			if err == io.EOF {
				return false, offset, nil
			}
			return false, offset, &Error{Kind: "unavailable", Message: fmt.Sprintf("output of %d in %s: %v", pid, id, err)}
		}
		switch f.Stream {
		case "error":
			if f.Error == nil {
				return false, offset, &Error{Kind: "unavailable", Message: "output stream failed"}
			}
			return false, offset, fromFrame(*f.Error)
		case "stdout", "stderr":
			end := f.Offset + int64(len(f.Data))
			if end <= offset {
				continue
			}
			if f.Offset < offset {
				f.Data, f.Offset = f.Data[offset-f.Offset:], offset
			}
			offset = end
		case "rewound", "lost":
			offset = f.Offset
		}
		if err := fn(f); err != nil {
			return false, offset, outputFnError{err}
		}
		if f.Stream == "exited" {
			return true, offset, nil
		}
	}
}
