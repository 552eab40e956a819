package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/amber-run/amber/api"
)

func ckPath(id string, rest string) string { return "/v1/checkpoints/" + url.PathEscape(id) + rest }

// operation posts in to path asking for progress frames, calls progress
// (when set) for each, and decodes the last frame.
func (c *Client) operation(ctx context.Context, path string, in any, progress func(api.Progress)) (api.OperationFrame, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return api.OperationFrame{}, err
	}
	req, err := c.request(ctx, "POST", path, nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return api.OperationFrame{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return api.OperationFrame{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.OperationFrame
		if err := dec.Decode(&f); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return f, fmt.Errorf("POST %s: the answer broke off before its result: %w", path, err)
		}
		switch {
		case f.Error != nil:
			return f, fromFrame(*f.Error)
		case f.Progress != nil:
			if progress != nil {
				progress(*f.Progress)
			}
		default:
			return f, nil
		}
	}
}

// Checkpoint cuts and commits a checkpoint of sandbox id; progress (may be
// nil) sees the phases and bytes uploaded.
func (c *Client) Checkpoint(ctx context.Context, id string, r api.CreateCheckpointRequest, progress func(api.Progress)) (api.Checkpoint, error) {
	f, err := c.operation(ctx, sbPath(id, "/checkpoints"), r, progress)
	if err != nil {
		return api.Checkpoint{}, err
	}
	if f.Checkpoint == nil {
		return api.Checkpoint{}, fmt.Errorf("checkpoint %s: the answer holds no checkpoint", id)
	}
	return *f.Checkpoint, nil
}

// ListCheckpoints returns sandbox id's checkpoints (committed ones unless all).
func (c *Client) ListCheckpoints(ctx context.Context, id string, all bool) ([]api.Checkpoint, error) {
	var out api.CheckpointList
	var q url.Values
	if all {
		q = url.Values{"all": {"true"}}
	}
	return out.Checkpoints, c.do(ctx, "GET", sbPath(id, "/checkpoints"), q, nil, &out)
}

// GetCheckpoint returns one checkpoint.
func (c *Client) GetCheckpoint(ctx context.Context, id string) (api.Checkpoint, error) {
	var out api.Checkpoint
	return out, c.do(ctx, "GET", ckPath(id, ""), nil, nil, &out)
}

// DeleteCheckpoint deletes a checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", ckPath(id, ""), nil, nil, nil)
}

// Restore restores checkpoint id (as a new sandbox when r.AsNew) and
// returns the sandbox.
func (c *Client) Restore(ctx context.Context, id string, r api.RestoreRequest, progress func(api.Progress)) (api.Sandbox, error) {
	return c.sandboxOp(ctx, ckPath(id, "/restore"), r, progress)
}

// Recover restores sandbox id in place from its latest checkpoint, or with
// r.ToEvent from the newest one cut at or before that event.
func (c *Client) Recover(ctx context.Context, id string, r api.RecoverRequest, progress func(api.Progress)) (api.Sandbox, error) {
	return c.sandboxOp(ctx, sbPath(id, "/recover"), r, progress)
}

func (c *Client) sandboxOp(ctx context.Context, path string, in any, progress func(api.Progress)) (api.Sandbox, error) {
	f, err := c.operation(ctx, path, in, progress)
	if err != nil {
		return api.Sandbox{}, err
	}
	if f.Sandbox == nil {
		return api.Sandbox{}, fmt.Errorf("POST %s: the answer holds no sandbox", path)
	}
	return *f.Sandbox, nil
}
