package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
)

// Exposure is a sandbox port that the daemon's proxy serves on the port's
// own origin (internal/edge/server: http://<port>-<sandbox>.<port domain>/).
// Token is the credential that opens it; it is known only to the caller of
// Expose (the store keeps its hash), so Exposures returns it empty.
type Exposure struct {
	SandboxID string
	Port      int
	Token     string
	Created   time.Time
}

func validPort(port int) error {
	if port < 1 || port > 65535 {
		return errdefs.InvalidArgumentf("port %d is not in 1..65535", port)
	}
	return nil
}

func (e *Engine) portDialer() (sandbox.PortDialer, error) {
	pd, ok := e.drv.(sandbox.PortDialer)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot reach ports inside a sandbox: %w", e.drv.Name(), errdefs.ErrNotImplemented)
	}
	return pd, nil
}

// DialPort connects to 127.0.0.1:port inside tenant's running sandbox id.
func (e *Engine) DialPort(ctx context.Context, tenant, id string, port int) (net.Conn, error) {
	if err := validPort(port); err != nil {
		return nil, err
	}
	pd, err := e.portDialer()
	if err != nil {
		return nil, err
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return pd.DialPort(ctx, id, port)
}

// newToken returns 32 random bytes, URL-safe base64 (256 bits).
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Expose makes port of tenant's sandbox id reachable through the daemon's
// proxy with a new random token. Exposing a port again replaces its token
// (the old URL stops working). Nothing needs to listen on the port yet;
// the proxy dials on each request.
func (e *Engine) Expose(ctx context.Context, tenant, id string, port int) (Exposure, error) {
	if err := validPort(port); err != nil {
		return Exposure{}, err
	}
	if _, err := e.portDialer(); err != nil {
		return Exposure{}, err
	}
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return Exposure{}, err
	}
	defer e.lock(id)()
	if sb, err = e.meta.Get(ctx, id); err != nil {
		return Exposure{}, err
	}
	if sb.State == meta.StateDestroyed || sb.State == meta.StateCreating {
		return Exposure{}, errdefs.FailedPreconditionf("sandbox %s is %s", id, sb.State)
	}
	token := newToken()
	me, err := e.meta.PutExposure(ctx, meta.Exposure{SandboxID: id, Port: port, Tenant: tenant, TokenHash: meta.HashKey(token)})
	if err != nil {
		return Exposure{}, err
	}
	e.lg.Info("port exposed", "sandbox_id", id, "port", port, "tenant_id", tenant)
	return Exposure{SandboxID: id, Port: port, Token: token, Created: me.Created}, nil
}

// Unexpose removes the exposure of port; its URL stops working at once
// (connections already proxied run on).
func (e *Engine) Unexpose(ctx context.Context, tenant, id string, port int) error {
	if err := validPort(port); err != nil {
		return err
	}
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return err
	}
	return e.meta.DeleteExposure(ctx, id, port)
}

// Exposures lists the exposed ports of tenant's sandbox id (Token is
// empty: the store does not know the tokens).
func (e *Engine) Exposures(ctx context.Context, tenant, id string) ([]Exposure, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	rows, err := e.meta.Exposures(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]Exposure, 0, len(rows))
	for _, r := range rows {
		out = append(out, Exposure{SandboxID: id, Port: r.Port, Created: r.Created})
	}
	return out, nil
}

// ResolveExposure returns the tenant that exposed port of sandbox id with
// token. Any mismatch — malformed id, no such sandbox or exposure, wrong
// token — is the same ErrNotFound, so a caller without the token learns
// nothing.
func (e *Engine) ResolveExposure(ctx context.Context, id string, port int, token string) (string, error) {
	notFound := errdefs.NotFoundf("no such exposed port")
	if validPort(port) != nil || token == "" || len(token) > 128 {
		return "", notFound
	}
	ex, err := e.meta.ExposureByToken(ctx, id, port, meta.HashKey(token))
	if errdefs.IsNotFound(err) {
		return "", notFound
	}
	if err != nil {
		return "", err
	}
	if _, err := e.Get(ctx, ex.Tenant, id); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
			return "", notFound
		}
		return "", err
	}
	return ex.Tenant, nil
}

// PublicPortsKey is the metadata key that makes every port of a sandbox
// public on its origin, without an exposure's token (E2B's default;
// the E2B control plane sets it unless the create asks for private
// traffic): PublicPorts.
const PublicPortsKey = "amber/public-ports"

// PublicPorts returns the tenant of sandbox id if its metadata make its
// ports public (PublicPortsKey "true"), else ErrNotFound, as
// ResolveExposure.
func (e *Engine) PublicPorts(ctx context.Context, id string, port int) (string, error) {
	notFound := errdefs.NotFoundf("no such exposed port")
	if validPort(port) != nil || id == "" || len(id) > 48 {
		return "", notFound
	}
	sb, err := e.meta.Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return "", notFound
	}
	if err != nil {
		return "", err
	}
	if sb.Pooled || sb.Tenant == "" || sb.State == meta.StateDestroyed || sb.Metadata[PublicPortsKey] != "true" {
		return "", notFound
	}
	return sb.Tenant, nil
}
