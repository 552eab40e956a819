package engine

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
)

// Egress policy precedence. Three parties set egress policy, each within
// the one above it:
//
//   - the operator: Options.Egress.Ceiling (`amber up --egress-ceiling`),
//     the most any tenant's sandbox may reach (nil: no ceiling);
//   - a tenant admin: the tenant policy's Egress (PUT
//     /v1/tenants/{t}/policy), both the default of the tenant's sandboxes
//     and the most they may reach; it must lie within the operator's
//     ceiling;
//   - a write key: a sandbox's own policy (CreateSandbox.Egress, PUT
//     /v1/sandboxes/{id}/egress), which must lie within the tenant's (when
//     the tenant admin set one) and the operator's.
//
// A policy that would widen its ceiling is refused when it is set, with a
// 403 naming the ceiling. The policy in force is always the intersection
// with every ceiling above it (egressPolicy), so a ceiling narrowed later
// narrows what is already set, without rewriting it.
//
// "Within" is pattern by pattern: every Allow pattern must be covered by
// one of the ceiling's (its host and port each equal or narrower: "*"
// covers everything, "*.s" covers "*.t.s" and "a.s"); a ceiling's nonzero
// RequestsPerSecond, Burst and BytesPerSecond are maxima (0, unlimited,
// widens them). Modes and OnDivergence are not permissions and are the
// narrower policy's own.

// egressCeiling is a ceiling and whose it is (for the error).
type egressCeiling struct {
	whose  string // "the operator's", "tenant acme's"
	policy meta.EgressPolicy
}

// ceilings returns the ceilings over tenant's sandboxes' own policies,
// highest first; withTenant false leaves the tenant's out (what a tenant
// policy itself must lie within).
func (e *egressRunner) ceilings(ctx context.Context, tenant string, withTenant bool) ([]egressCeiling, error) {
	var cs []egressCeiling
	if e.egr.ceiling != nil {
		cs = append(cs, egressCeiling{"the operator's", *e.egr.ceiling})
	}
	if withTenant {
		tp, err := e.meta.TenantPolicy(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("egress ceiling of tenant %s: %w", tenant, err)
		}
		if tp.Egress != nil {
			cs = append(cs, egressCeiling{"tenant " + tenant + "'s", *tp.Egress})
		}
	}
	return cs, nil
}

// checkTenantEgress refuses a tenant policy's egress that widens the
// operator's ceiling.
func (e *egressRunner) checkTenantEgress(ctx context.Context, tenant string, p *meta.EgressPolicy) error {
	if p == nil {
		return nil
	}
	cs, err := e.ceilings(ctx, tenant, false)
	if err != nil {
		return err
	}
	return within(*p, cs)
}

// checkSandboxEgress refuses a sandbox policy of tenant's that widens the
// tenant's or the operator's ceiling.
func (e *egressRunner) checkSandboxEgress(ctx context.Context, tenant string, p *meta.EgressPolicy) error {
	if p == nil {
		return nil
	}
	cs, err := e.ceilings(ctx, tenant, true)
	if err != nil {
		return err
	}
	return within(*p, cs)
}

// within reports, as a PermissionDenied naming the ceiling, the first way p
// widens one of cs.
func within(p meta.EgressPolicy, cs []egressCeiling) error {
	for _, c := range cs {
		for _, a := range p.Allow {
			covered := false
			for _, ca := range c.policy.Allow {
				covered = covered || coversDest(ca, a)
			}
			if !covered {
				return errdefs.PermissionDeniedf("egress policy: %q is outside %s egress ceiling (allow %s)", a, c.whose, ceilingList(c.policy.Allow))
			}
		}
		for _, l := range []struct {
			name       string
			p, ceiling float64
		}{
			{"requests_per_second", p.RequestsPerSecond, c.policy.RequestsPerSecond},
			{"burst", float64(p.Burst), float64(c.policy.Burst)},
			{"bytes_per_second", float64(p.BytesPerSecond), float64(c.policy.BytesPerSecond)},
		} {
			if l.ceiling > 0 && (l.p == 0 || l.p > l.ceiling) {
				return errdefs.PermissionDeniedf("egress policy: %s %s is above %s egress ceiling (%v)", l.name, unlimited(l.p), c.whose, l.ceiling)
			}
		}
	}
	return nil
}

func unlimited(v float64) string {
	if v == 0 {
		return "0 (unlimited)"
	}
	return fmt.Sprint(v)
}

func ceilingList(allow []string) string {
	if len(allow) == 0 {
		return "nothing"
	}
	if len(allow) > 8 {
		return strings.Join(allow[:8], ", ") + fmt.Sprintf(", … (%d patterns)", len(allow))
	}
	return strings.Join(allow, ", ")
}

// intersectEgress is p cut down to ceiling c: the Allow patterns both
// reach, the smaller nonzero limits; p's modes and divergence policy.
func intersectEgress(p, c meta.EgressPolicy) meta.EgressPolicy {
	out := p
	out.Allow = nil
	seen := map[string]bool{}
	for _, a := range p.Allow {
		for _, ca := range c.Allow {
			if x, ok := intersectDest(a, ca); ok && !seen[x] {
				seen[x] = true
				out.Allow = append(out.Allow, x)
			}
		}
	}
	out.RequestsPerSecond = minLimit(p.RequestsPerSecond, c.RequestsPerSecond)
	out.Burst = int(minLimit(float64(p.Burst), float64(c.Burst)))
	out.BytesPerSecond = int64(minLimit(float64(p.BytesPerSecond), float64(c.BytesPerSecond)))
	return out
}

// minLimit is the smaller of two limits where 0 means unlimited.
func minLimit(a, b float64) float64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// coversDest reports whether pattern c reaches everything pattern p does
// (both "host:port" patterns, see meta.EgressPolicy.Allow).
func coversDest(c, p string) bool {
	ch, cp, err1 := net.SplitHostPort(c)
	ph, pp, err2 := net.SplitHostPort(p)
	if err1 != nil || err2 != nil {
		return false
	}
	return coversPort(cp, pp) && coversHost(normHost(ch), normHost(ph))
}

func coversPort(c, p string) bool {
	return c == "*" || (p != "*" && strings.TrimLeft(c, "0") == strings.TrimLeft(p, "0"))
}

func normHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// coversHost: "*" covers all; "*.s" covers "*.t" for t = s or a subdomain
// of s, and a name that is a proper subdomain of s (not s itself, nor an IP
// address); a name or an address covers only itself.
func coversHost(c, p string) bool {
	switch {
	case c == "*":
		return true
	case p == "*":
		return false
	case strings.HasPrefix(c, "*."):
		suffix := c[1:] // ".s"
		if strings.HasPrefix(p, "*.") {
			return p[1:] == suffix || strings.HasSuffix(p[1:], suffix)
		}
		if _, err := netip.ParseAddr(p); err == nil {
			return false
		}
		return strings.HasSuffix(p, suffix)
	default:
		return c == p
	}
}

// intersectDest is the pattern reaching what both a and b reach, if any.
func intersectDest(a, b string) (string, bool) {
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil {
		return "", false
	}
	var port string
	switch {
	case coversPort(ap, bp):
		port = bp
	case coversPort(bp, ap):
		port = ap
	default:
		return "", false
	}
	ah, bh = normHost(ah), normHost(bh)
	var host string
	switch {
	case coversHost(ah, bh):
		host = bh
	case coversHost(bh, ah):
		host = ah
	default:
		return "", false
	}
	return net.JoinHostPort(host, port), true
}
