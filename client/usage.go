package client

import (
	"context"
	"net/url"

	"github.com/amber-run/amber/api"
)

// UsageQuery selects a usage report (GET /v1/usage). Empty fields: the
// server's defaults (every record, grouped by meter, the key's tenant).
type UsageQuery struct {
	From, To string // RFC 3339 or YYYY-MM-DD
	GroupBy  string // meter, sandbox or day
	Tenant   string // another tenant (the operator's key)
}

// Usage returns the usage report q asks for.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (api.UsageReport, error) {
	var out api.UsageReport
	v := url.Values{}
	for k, s := range map[string]string{"from": q.From, "to": q.To, "group_by": q.GroupBy, "tenant": q.Tenant} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return out, c.do(ctx, "GET", "/v1/usage", v, nil, &out)
}
