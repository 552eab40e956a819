package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/meta"
)

// egressRunner starts and polices sandboxes' egress runs through the
// node's gateway (egress.go, egress_ceiling.go); it needs only the core.
type egressRunner struct {
	*core
	egr egressRuns
}

// egressRuns is what starts and polices sandboxes' egress runs (egress.go,
// egress_ceiling.go).
type egressRuns struct {
	gw       *gateway.Gateway
	def      meta.EgressPolicy
	ceiling  *meta.EgressPolicy // the operator's (egress_ceiling.go)
	tenantCA func(ctx context.Context, tenant string) ([]byte, error)
}

// Egress: the engine tells the node's gateway which run each sandbox's
// traffic belongs to (see package gateway: request numbering restarts at
// every cut, taken or restored from).
//
//   - create (and a claim from the warm pool): run "<sandbox>.start";
//   - checkpoint: the gateway holds the sandbox's new requests and drains
//     those in flight (Hold) before the driver cuts, and the run named by
//     the checkpoint starts right after the cut, so every request is
//     wholly before the cut or wholly after it;
//   - restore, in place or as a new sandbox: the run of the checkpoint
//     restored from starts before the driver restores, so the first
//     request of the re-run is already numbered in it;
//   - a daemon that restarts while a sandbox ran on resumes its run (the
//     numbering continues from the journal: nothing re-ran).
//
// The run is recorded in meta (SetEgressRun) before the gateway starts it:
// a daemon that dies in between resumes the run the sandbox is in. Journal
// appends carry this node's lease epoch on the sandbox's effects stream.

// egressHoldTimeout bounds how long a cut waits for requests in flight.
const egressHoldTimeout = 10 * time.Second

// startRunID is the run of a sandbox that was never cut.
func startRunID(sandbox string) string { return sandbox + ".start" }

// egressPolicy is sb's effective policy: its own, else its tenant's, else
// the daemon's default — cut down to every ceiling above it (see
// egress_ceiling.go: the tenant's over a sandbox's own, the operator's over
// all). A tenant policy that cannot be read is an error, never no ceiling.
func (e *egressRunner) egressPolicy(ctx context.Context, sb meta.Sandbox) (meta.EgressPolicy, error) {
	own, _, err := e.meta.SandboxEgress(ctx, sb.ID)
	if err != nil {
		return meta.EgressPolicy{}, err
	}
	tp, err := e.meta.TenantPolicy(ctx, sb.Tenant)
	if err != nil {
		return meta.EgressPolicy{}, fmt.Errorf("egress policy of %s: tenant policy: %w", sb.ID, err)
	}
	var p meta.EgressPolicy
	switch {
	case own != nil:
		p = *own
		if tp.Egress != nil {
			p = intersectEgress(p, *tp.Egress)
		}
	case tp.Egress != nil:
		p = *tp.Egress
	default:
		p = e.egr.def
	}
	if e.egr.ceiling != nil {
		p = intersectEgress(p, *e.egr.ceiling)
	}
	return p, nil
}

// TenantEgressAllows reports whether tenant's egress policy lets it reach
// host:port: the policy a sandbox of the tenant without one of its own
// gets (the tenant's, else the daemon's default), cut down to the
// operator's ceiling. The session harness asks it for model endpoints a
// tenant chose, so model traffic meets the same allowlist as the tenant's
// sandboxes. A tenant policy that cannot be read is an error, never "yes".
func (e *egressRunner) TenantEgressAllows(ctx context.Context, tenant, host string, port uint16) (bool, error) {
	tp, err := e.meta.TenantPolicy(ctx, tenant)
	if err != nil {
		return false, fmt.Errorf("tenant policy of %s: %w", tenant, err)
	}
	p := e.egr.def
	if tp.Egress != nil {
		p = *tp.Egress
	}
	if e.egr.ceiling != nil {
		p = intersectEgress(p, *e.egr.ceiling)
	}
	gp := gatewayPolicy(p)
	return gp.Allows(host, port), nil
}

// gatewayPolicy converts an API policy into the gateway's.
func gatewayPolicy(p meta.EgressPolicy) gateway.Policy {
	g := gateway.Policy{Allow: append([]string(nil), p.Allow...), RequestsPerSecond: p.RequestsPerSecond, Burst: p.Burst,
		BytesPerSecond: p.BytesPerSecond, OnDivergence: gateway.DivergencePolicy(p.OnDivergence)}
	for _, m := range p.Modes {
		g.Modes = append(g.Modes, gateway.ModeRule{Dest: m.Dest, Method: m.Method, Mode: gateway.Mode(m.Mode)})
	}
	return g
}

// startRun starts run of sb in the gateway (resume: continue its
// numbering). Sandboxes without a tenant (the warm pool) have no run yet.
func (e *egressRunner) startRun(ctx context.Context, sb meta.Sandbox, run string, resume bool) error {
	if e.egr.gw == nil || sb.Tenant == "" {
		return nil
	}
	pol, err := e.egressPolicy(ctx, sb)
	if err != nil {
		return err
	}
	if err := e.meta.SetEgressRun(ctx, sb.ID, run); err != nil {
		return err
	}
	l, err := e.holdStreamLease(ctx, "effects:"+sb.ID, gateway.Stream(sb.ID), "effects of sandbox "+sb.ID)
	if err != nil {
		return err
	}
	if err := e.egr.gw.StartRun(ctx, gateway.Run{Tenant: sb.Tenant, Sandbox: sb.ID, ID: run, Epoch: l.Epoch,
		Policy: gatewayPolicy(pol), Resume: resume}); err != nil {
		return fmt.Errorf("egress run %s of %s: %w", run, sb.ID, err)
	}
	return nil
}

// holdEgress begins a cut of sandbox id in the gateway (see Hold).
func (e *egressRunner) holdEgress(id string) func() {
	if e.egr.gw == nil {
		return func() {}
	}
	release, _ := e.egr.gw.Hold(id, egressHoldTimeout)
	return release
}

// prepareEgress writes what a new sandbox needs to use the gateway: its
// resolv.conf names the gateway's DNS.
func (e *egressRunner) prepareEgress(ctx context.Context, id string) error {
	if e.egr.gw == nil {
		return nil
	}
	fs, err := e.drv.Files(ctx, id)
	if err != nil {
		return err
	}
	if err := fs.WriteFile(ctx, "/etc/resolv.conf", bytes.NewReader([]byte(egress.ResolvConf)), 0o644); err != nil {
		return fmt.Errorf("sandbox %s: resolv.conf: %w", id, err)
	}
	return nil
}

// reattachEgress serves a sandbox that ran on while the daemon was down:
// its sockets in the gateway namespace are opened again and its run
// resumes where the journal left it.
func (e *egressRunner) reattachEgress(ctx context.Context, sb meta.Sandbox) error {
	if e.egr.gw == nil {
		return nil
	}
	if e.net != nil {
		if err := e.net.Listen(sb.ID); err != nil {
			return err
		}
	}
	_, run, err := e.meta.SandboxEgress(ctx, sb.ID)
	if err != nil {
		return err
	}
	if run == "" {
		run = startRunID(sb.ID)
	}
	return e.startRun(ctx, sb, run, true)
}

// SetEgress sets sandbox id's own egress policy (nil: follow the tenant's)
// and applies it to its current run at once.
func (e *egressRunner) SetEgress(ctx context.Context, tenant, id string, p *meta.EgressPolicy) error {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	if sb.State == meta.StateDestroyed {
		return errdefs.FailedPreconditionf("sandbox %s is destroyed", id)
	}
	if err := e.checkSandboxEgress(ctx, sb.Tenant, p); err != nil {
		return err
	}
	defer e.lock(id)()
	if err := e.meta.SetSandboxEgress(ctx, id, p); err != nil {
		return err
	}
	_, run, err := e.meta.SandboxEgress(ctx, id)
	if err != nil || run == "" || sb.State != meta.StateRunning {
		return err
	}
	return e.startRun(ctx, sb, run, true)
}

// Egress returns sandbox id's own egress policy (nil if none), the one in
// force, and its current run.
func (e *egressRunner) Egress(ctx context.Context, tenant, id string) (own *meta.EgressPolicy, eff meta.EgressPolicy, run string, err error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return nil, eff, "", err
	}
	if own, run, err = e.meta.SandboxEgress(ctx, id); err != nil {
		return nil, eff, "", err
	}
	eff, err = e.egressPolicy(ctx, sb)
	return own, eff, run, err
}

// Effect is one request of a sandbox's effect journal, summarized.
type Effect struct {
	Key, Run, Method, URL, Mode, Error string
	// State: "done", "in-flight" or "needs-reconciliation".
	State       string
	Status      int
	Attempts    int
	Divergences int
	Seq         uint64
	// Reconciled is the operator's note when the outcome was recorded by
	// a reconciliation (Reconcile), not by the upstream's answer.
	Reconciled string
	// Replays counts the answers served from the journal for this key (a
	// re-run's), as the audit trail recorded them (egress.replay).
	Replays int
}

// Effects reads sandbox id's effect journal (the effects/<id> stream), one
// entry per request key, in the order their first intent was recorded.
func (e *egressRunner) Effects(ctx context.Context, tenant, id string) ([]Effect, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	stream := gateway.Stream(id)
	byKey := map[string]*Effect{}
	var order []string
	for from := uint64(1); ; {
		evs, err := e.log.Read(ctx, stream, from, 1000)
		if errdefs.IsCompacted(err) {
			b, berr := e.log.Bounds(ctx, stream)
			if berr != nil {
				return nil, berr
			}
			from = b.First
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			from = ev.Seq + 1
			var p struct {
				Key, Run, Method, URL, Mode, Error, Reconciled string
				Status                                         int
			}
			if err := json.Unmarshal(ev.Payload, &p); err != nil {
				return nil, errdefs.DataLossf("%s/%d: %v", stream, ev.Seq, err)
			}
			if p.Key == "" {
				continue
			}
			fx := byKey[p.Key]
			if fx == nil {
				if ev.Type != gateway.EventIntent {
					continue
				}
				fx = &Effect{Key: p.Key, Seq: ev.Seq, State: "in-flight"}
				byKey[p.Key] = fx
				order = append(order, p.Key)
			}
			switch ev.Type {
			case gateway.EventIntent:
				fx.Attempts++
				fx.Run, fx.Method, fx.URL, fx.Mode = p.Run, p.Method, p.URL, p.Mode
			case gateway.EventOutcome:
				fx.State, fx.Status, fx.Error, fx.Reconciled = "done", p.Status, p.Error, p.Reconciled
			case gateway.EventReconcile:
				fx.State = "needs-reconciliation"
			case gateway.EventDivergence:
				fx.Divergences++
			}
		}
		if len(evs) < 1000 {
			break
		}
	}
	if err := e.countReplays(ctx, tenant, id, byKey); err != nil {
		return nil, err
	}
	out := make([]Effect, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	return out, nil
}

// countReplays adds to byKey the answers served from the journal, read
// from tenant's audit trail: the gateway's decisions are audited as
// "egress.replay" by "sandbox:<id>" with "key=<key>" in the detail
// (cmd/amber/egress.go). The trail is written asynchronously, so a replay
// of the last moments may not be counted yet.
func (e *egressRunner) countReplays(ctx context.Context, tenant, id string, byKey map[string]*Effect) error {
	if e.audit == nil || len(byKey) == 0 {
		return nil
	}
	actor := "sandbox:" + id
	for from := uint64(1); ; {
		ents, err := e.audit.List(ctx, tenant, from, 1000)
		if errdefs.IsCompacted(err) {
			b, berr := e.log.Bounds(ctx, audit.Stream(tenant))
			if berr != nil {
				return berr
			}
			from = b.First
			continue
		}
		if err != nil {
			return err
		}
		for _, en := range ents {
			from = en.Seq + 1
			if en.Record.Action != "egress.replay" || en.Record.Actor != actor {
				continue
			}
			for _, f := range strings.Fields(en.Record.Detail) {
				if k, ok := strings.CutPrefix(f, "key="); ok && byKey[k] != nil {
					byKey[k].Replays++
				}
			}
		}
		if len(ents) < 1000 {
			return nil
		}
	}
}

// Reconcile records an operator's resolution of sandbox id's effect that
// needs reconciliation (gateway.Reconcile): its outcome from then on.
func (e *egressRunner) Reconcile(ctx context.Context, tenant, id string, r gateway.Resolution) (Effect, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return Effect{}, err
	}
	if e.egr.gw == nil {
		return Effect{}, errdefs.FailedPreconditionf("this daemon runs no egress gateway: nothing to reconcile")
	}
	if _, err := e.egr.gw.Reconcile(ctx, id, r); err != nil {
		return Effect{}, err
	}
	fxs, err := e.Effects(ctx, tenant, id)
	if err != nil {
		return Effect{}, err
	}
	for _, f := range fxs {
		if f.Key == r.Key {
			return f, nil
		}
	}
	return Effect{}, errdefs.DataLossf("effect %s of sandbox %s reconciled but not found in its journal", r.Key, id)
}

// Where a sandbox's trust store gets its tenant's egress CA: Debian's
// bundle (OpenSSL, curl, Python, Go read it) and the directory
// update-ca-certificates rebuilds the bundle from, so a rebuild keeps it.
const (
	caBundle = "/etc/ssl/certs/ca-certificates.crt"
	caFile   = "/usr/local/share/ca-certificates/amber-egress.crt"
)

// installCA adds sb's tenant's egress CA to its trust store, so TLS to
// the gateway verifies (the gateway terminates it with leaves this CA
// signs). A template without a bundle gets one holding just this CA.
func (e *egressRunner) installCA(ctx context.Context, sb meta.Sandbox) error {
	if e.egr.gw == nil || e.egr.tenantCA == nil || sb.Tenant == "" {
		return nil
	}
	cert, err := e.egr.tenantCA(ctx, sb.Tenant)
	if err != nil {
		return fmt.Errorf("egress CA of tenant %s: %w", sb.Tenant, err)
	}
	fs, err := e.drv.Files(ctx, sb.ID)
	if err != nil {
		return err
	}
	var bundle bytes.Buffer
	if err := fs.ReadFile(ctx, caBundle, &bundle); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: read %s: %w", sb.ID, caBundle, err)
	}
	if bytes.Contains(bundle.Bytes(), cert) {
		return nil
	}
	if n := bundle.Len(); n > 0 && bundle.Bytes()[n-1] != '\n' {
		bundle.WriteByte('\n')
	}
	bundle.Write(cert)
	for _, d := range []string{"/etc/ssl/certs", "/usr/local/share/ca-certificates"} {
		if err := fs.Mkdir(ctx, d, 0o755); err != nil { // like mkdir -p
			return fmt.Errorf("sandbox %s: mkdir %s: %w", sb.ID, d, err)
		}
	}
	if err := fs.WriteFile(ctx, caFile, bytes.NewReader(cert), 0o644); err != nil {
		return fmt.Errorf("sandbox %s: %s: %w", sb.ID, caFile, err)
	}
	if err := fs.WriteFile(ctx, caBundle, &bundle, 0o644); err != nil {
		return fmt.Errorf("sandbox %s: %s: %w", sb.ID, caBundle, err)
	}
	return nil
}

// restoreKeepsConnections says whether restoring sb from ck continues
// exactly where sb stopped — it was stopped by taking ck (checkpoint
// --stop, or idle) and ck is its newest cut — so that its connections
// through the gateway, whose other ends never moved, carry on.
func (e *egressRunner) restoreKeepsConnections(ctx context.Context, sb meta.Sandbox, ck meta.Checkpoint) bool {
	if sb.State != meta.StateStopped || ck.SandboxID != sb.ID || (sb.Reason != stoppedAtCutReason && !idleStopped(sb)) {
		return false
	}
	latest, err := e.latestCheckpoint(ctx, sb.ID)
	return err == nil && latest.ID == ck.ID
}
