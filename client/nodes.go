package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/amber-run/amber/api"
)

// Nodes lists the nodes of a deployment on shared stores (the operator's
// key).
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out api.NodeList
	return out.Nodes, c.do(ctx, "GET", "/v1/nodes", nil, nil, &out)
}

// DrainNode marks node id draining: it takes no new sandboxes and its
// sandboxes move to other nodes. Without wait it returns at once (the
// node and how many sandboxes it holds); with wait it calls each (may be
// nil) with every frame — one per sandbox moved — and returns the last,
// once the node holds no sandboxes (Done), or the error that stopped it.
func (c *Client) DrainNode(ctx context.Context, id string, wait bool, each func(api.DrainFrame)) (api.DrainFrame, error) {
	path := "/v1/nodes/" + url.PathEscape(id) + "/drain"
	if !wait {
		var out api.DrainFrame
		return out, c.do(ctx, "POST", path, nil, nil, &out)
	}
	req, err := c.request(ctx, "POST", path, url.Values{"wait": {"true"}}, nil, "")
	if err != nil {
		return api.DrainFrame{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return api.DrainFrame{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.DrainFrame
		if err := dec.Decode(&f); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return f, fmt.Errorf("drain node %s: the answer broke off before the node was empty: %w", id, err)
		}
		if f.Error != nil {
			return f, fromFrame(*f.Error)
		}
		if each != nil {
			each(f)
		}
		if f.Done {
			return f, nil
		}
	}
}

// UndrainNode makes draining node id live again (it takes new sandboxes).
func (c *Client) UndrainNode(ctx context.Context, id string) (api.Node, error) {
	var out api.Node
	return out, c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(id)+"/undrain", nil, nil, &out)
}
