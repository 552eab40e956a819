package client

import (
	"context"
	"fmt"
	"net/url"

	"github.com/amber-run/amber/api"
)

func tenantPath(tenant string, rest ...string) string {
	p := "/v1/tenants/" + url.PathEscape(tenant)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// CreateTenant creates a tenant. It needs the operator's key (an
// admin-scoped key of tenant "default").
func (c *Client) CreateTenant(ctx context.Context, r api.CreateTenantRequest) (api.Tenant, error) {
	var out api.Tenant
	return out, c.do(ctx, "POST", "/v1/tenants", nil, r, &out)
}

// Tenants lists every tenant (the operator) or the caller's own (another
// tenant's admin key).
func (c *Client) Tenants(ctx context.Context) ([]api.Tenant, error) {
	var out api.TenantList
	return out.Tenants, c.do(ctx, "GET", "/v1/tenants", nil, nil, &out)
}

// CreateKey creates an API key of tenant. The answer's Key is the secret,
// returned this once.
func (c *Client) CreateKey(ctx context.Context, tenant string, r api.CreateKeyRequest) (api.APIKey, error) {
	var out api.APIKey
	return out, c.do(ctx, "POST", tenantPath(tenant, "keys"), nil, r, &out)
}

// Keys lists tenant's keys (without their secrets).
func (c *Client) Keys(ctx context.Context, tenant string) ([]api.APIKey, error) {
	var out api.APIKeyList
	return out.Keys, c.do(ctx, "GET", tenantPath(tenant, "keys"), nil, nil, &out)
}

// RevokeKey revokes tenant's key name.
func (c *Client) RevokeKey(ctx context.Context, tenant, name string) error {
	return c.do(ctx, "DELETE", tenantPath(tenant, "keys", name), nil, nil, nil)
}

// TenantPolicy returns tenant's recovery policy.
func (c *Client) TenantPolicy(ctx context.Context, tenant string) (api.TenantPolicy, error) {
	var out api.TenantPolicy
	return out, c.do(ctx, "GET", "/v1/tenants/"+url.PathEscape(tenant)+"/policy", nil, nil, &out)
}

// SetTenantPolicy replaces tenant's recovery policy and returns it.
func (c *Client) SetTenantPolicy(ctx context.Context, tenant string, p api.TenantPolicy) (api.TenantPolicy, error) {
	var out api.TenantPolicy
	return out, c.do(ctx, "PUT", "/v1/tenants/"+url.PathEscape(tenant)+"/policy", nil, p, &out)
}

// Audit returns the caller's tenant's audit records (tenant: another's, for
// the operator) from position from.
func (c *Client) Audit(ctx context.Context, tenant string, from uint64) ([]api.AuditRecord, error) {
	var out api.AuditList
	q := url.Values{"from": {fmt.Sprint(from)}}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	return out.Records, c.do(ctx, "GET", "/v1/audit", q, nil, &out)
}

// VerifyAudit checks the tenant's audit hash chain.
func (c *Client) VerifyAudit(ctx context.Context, tenant string) (api.AuditReport, error) {
	var out api.AuditReport
	var q url.Values
	if tenant != "" {
		q = url.Values{"tenant": {tenant}}
	}
	return out, c.do(ctx, "GET", "/v1/audit/verify", q, nil, &out)
}

// TenantQuota returns tenant's quota.
func (c *Client) TenantQuota(ctx context.Context, tenant string) (api.TenantQuota, error) {
	var out api.TenantQuota
	return out, c.do(ctx, "GET", "/v1/tenants/"+url.PathEscape(tenant)+"/quota", nil, nil, &out)
}

// SetTenantQuota replaces tenant's quota (the operator's key).
func (c *Client) SetTenantQuota(ctx context.Context, tenant string, q api.TenantQuota) (api.TenantQuota, error) {
	var out api.TenantQuota
	return out, c.do(ctx, "PUT", "/v1/tenants/"+url.PathEscape(tenant)+"/quota", nil, q, &out)
}

// PutSecret sets tenant's secret name, bound to hosts. The value is sent
// once and never returned.
func (c *Client) PutSecret(ctx context.Context, tenant, name string, value []byte, hosts []string) (api.Secret, error) {
	var out api.Secret
	return out, c.do(ctx, "PUT", "/v1/tenants/"+url.PathEscape(tenant)+"/secrets/"+url.PathEscape(name), nil,
		api.PutSecretRequest{Value: string(value), Hosts: hosts}, &out)
}

// Secrets lists tenant's secrets (names and hosts, never values).
func (c *Client) Secrets(ctx context.Context, tenant string) ([]api.Secret, error) {
	var out api.SecretList
	return out.Secrets, c.do(ctx, "GET", "/v1/tenants/"+url.PathEscape(tenant)+"/secrets", nil, nil, &out)
}

// DeleteSecret deletes tenant's secret name.
func (c *Client) DeleteSecret(ctx context.Context, tenant, name string) error {
	return c.do(ctx, "DELETE", "/v1/tenants/"+url.PathEscape(tenant)+"/secrets/"+url.PathEscape(name), nil, nil, nil)
}
