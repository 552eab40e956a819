package client

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/amber-run/amber/api"
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
