package client

import (
	"context"

	"github.com/amber-run/amber/api"
)

// Nodes lists the nodes of a deployment on shared stores (the operator's
// key).
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out api.NodeList
	return out.Nodes, c.do(ctx, "GET", "/v1/nodes", nil, nil, &out)
}
