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

// ReconcileEffect records an operator's resolution of an effect of sandbox
// id that needs reconciliation: r's status and body become its outcome.
func (c *Client) ReconcileEffect(ctx context.Context, id string, r api.ReconcileRequest) (api.Effect, error) {
	var out api.Effect
	return out, c.do(ctx, "POST", sbPath(id, "/effects/reconcile"), nil, r, &out)
}

// SandboxStats reads a running sandbox's CPU, memory and disk.
func (c *Client) SandboxStats(ctx context.Context, id string) (api.SandboxStats, error) {
	var out api.SandboxStats
	return out, c.do(ctx, "GET", sbPath(id, "/stats"), nil, nil, &out)
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
