package client

import (
	"context"

	"github.com/amber-run/amber/api"
)

// Effects returns sandbox id's effect journal.
func (c *Client) Effects(ctx context.Context, id string) (api.EffectList, error) {
	var out api.EffectList
	return out, c.do(ctx, "GET", sbPath(id, "/effects"), nil, nil, &out)
}

// Egress returns sandbox id's egress policy.
func (c *Client) Egress(ctx context.Context, id string) (api.SandboxEgress, error) {
	var out api.SandboxEgress
	return out, c.do(ctx, "GET", sbPath(id, "/egress"), nil, nil, &out)
}

// SetEgress sets sandbox id's own egress policy; nil returns it to its
// tenant's.
func (c *Client) SetEgress(ctx context.Context, id string, p *api.EgressPolicy) (api.SandboxEgress, error) {
	var out api.SandboxEgress
	// A nil p is sent as JSON null (the typed nil is a non-nil interface).
	return out, c.do(ctx, "PUT", sbPath(id, "/egress"), nil, p, &out)
}
