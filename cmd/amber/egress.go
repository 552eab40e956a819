package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/metrics"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/internal/state/secretstore"
	"github.com/amber-run/amber/lib/failpoint"
)

// egressOptions are `amber up`'s egress flags.
type egressOptions struct {
	enabled bool
	allow   []string // the default policy's allowlist
	// ceiling is the operator's egress ceiling (nil: none).
	ceiling []string
	hosts   []string // NAME=IP, the operator's names
	// journal off is the tests' negative control (hidden flag).
	journal bool
	// caFiles are PEM bundles the gateway trusts upstream besides the
	// system's (a corporate CA; a test's server).
	caFiles []string
}

// upstreamRoots is the system pool plus the --egress-ca-file bundles; nil
// (the system's) without any.
func upstreamRoots(files []string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usageError{fmt.Errorf("--egress-ca-file: %w", err)}
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, usageError{fmt.Errorf("--egress-ca-file %s: no PEM certificate in it", f)}
		}
	}
	return pool, nil
}

// parseHosts reads NAME=IP pairs.
func parseHosts(pairs []string) (map[string]netip.Addr, error) {
	out := map[string]netip.Addr{}
	for _, p := range pairs {
		name, ip, ok := strings.Cut(p, "=")
		a, err := netip.ParseAddr(ip)
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		if !ok || name == "" || err != nil || strings.ContainsAny(name, "*/: ") {
			return nil, usageError{fmt.Errorf("--egress-host %q: want NAME=IP, e.g. shop.test=127.0.0.1", p)}
		}
		out[name] = a
	}
	return out, nil
}

// defaultEgress is the policy of sandboxes whose tenant set none.
func defaultEgress(allow []string) (meta.EgressPolicy, error) {
	p := meta.EgressPolicy{Allow: allow}
	if err := p.Check(); err != nil {
		return p, usageError{fmt.Errorf("--egress-allow: %w", err)}
	}
	return p, nil
}

// ceilingEgress is the operator's egress ceiling (--egress-ceiling), nil
// without one.
func ceilingEgress(allow []string) (*meta.EgressPolicy, error) {
	if len(allow) == 0 {
		return nil, nil
	}
	p := meta.EgressPolicy{Allow: allow}
	if err := p.Check(); err != nil {
		return nil, usageError{fmt.Errorf("--egress-ceiling: %w", err)}
	}
	return &p, nil
}

// newGateway makes the node's gateway: journal on the event log, the
// operator's names, every decision audited (asynchronously: OnDecision
// must not block a request; a full queue drops records and counts them).
func newGateway(ctx context.Context, log eventlog.Store, reg *eventlog.Registry, trail *audit.Trail, hosts map[string]netip.Addr,
	journal bool, fps *failpoint.Set, fenceCheck func(context.Context) error, secrets *secretstore.Store, upstreamRoots *x509.CertPool, tp trace.TracerProvider, lg *slog.Logger,
	meterTo *atomic.Pointer[engine.Engine], mx *metrics.Metrics) *gateway.Gateway {
	gateway.RegisterEvents(reg)
	decisions := make(chan gateway.Decision, 4096)
	var dropped atomic.Int64
	go func() {
		for d := range decisions {
			outcome := "ok"
			switch d.Kind {
			case "deny", "rate-limited", "fenced", "error", "divergence", "reconcile":
				outcome = d.Kind
			}
			detail := d.Reason
			if d.Key != "" {
				detail = strings.TrimSpace(detail + " key=" + d.Key)
			}
			if len(d.Secrets) > 0 {
				// Secret use is audited by name, never by value.
				detail = strings.TrimSpace(detail + " secrets=" + strings.Join(d.Secrets, ","))
			}
			_, err := trail.Append(context.WithoutCancel(ctx), d.Tenant, audit.Record{
				Time: d.Time, Actor: "sandbox:" + d.Sandbox, Action: "egress." + d.Kind,
				Resource: strings.TrimSpace(d.Method + " " + firstNonEmpty(d.URL, d.Dest)),
				Outcome:  outcome, Status: d.Status, Detail: detail,
			})
			if err != nil {
				lg.Warn("audit of an egress decision failed", "err", err)
			}
		}
	}()
	var j *gateway.Journal
	if journal {
		j = gateway.NewJournal(log)
	} else {
		lg.Warn("egress journal OFF: requests are forwarded unjournaled and effects may happen twice after a restore (--egress-journal=false is for tests)")
	}
	return gateway.New(gateway.Options{
		Journal:       j,
		Failpoints:    fps,
		Fence:         fenceCheck,
		Secrets:       secrets,
		TLS:           secrets,
		UpstreamRoots: upstreamRoots,
		Tracer:        tp,
		Hosts:         hosts,
		Logger:        lg.With("component", "gateway"),
		OnDecision: func(d gateway.Decision) {
			if d.Tenant == "" {
				return
			}
			if mx != nil {
				mx.GatewayDecision(d.Tenant, d.Kind)
			}
			if e := meterTo.Load(); e != nil {
				e.MeterDecision(d) // egress metering (engine/metering.go): counted in memory, never blocks
			}
			select {
			case decisions <- d:
			default:
				if n := dropped.Add(1); n == 1 || n%1000 == 0 {
					lg.Error("egress audit queue full; decisions not audited", "dropped", n)
				}
			}
		},
	})
}

// newEgressNetwork makes the plumbing under DATA_DIR/egress; its gateway
// is set once the event log is open (SetServer).
func newEgressNetwork(dataDir string, lg *slog.Logger) (*egress.Network, error) {
	return egress.New(filepath.Join(dataDir, "egress"), nil, lg.With("component", "egress"))
}
