package engine

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/meta"
)

// core is what every part of the engine shares: the driver, the stores,
// the per-sandbox locks, the lifecycle's observers, this node's identity
// and leases, and the helpers over them (lock, appendEvents, span, the
// row reads). Each capability (Engine's doc) holds the one core and, as
// named fields, only the other capabilities it calls; core names none of
// them, so no capability reaches another through it.
type core struct {
	drv   sandbox.Driver
	meta  metadata.Store
	log   eventlog.Store
	reg   *eventlog.Registry
	clock clock.Clock
	lg    *slog.Logger

	locks sync.Map // sandbox id → *sync.Mutex: serialises lifecycle changes
	cuts  cutLocks // a cut (writer) excludes calls into the sandbox (ops.go, cutlock.go)
	life  []lifecycleObserver

	audit  *audit.Trail
	tracer trace.Tracer
	obs    Observer // told about checkpoints, restores, quota refusals and usage
	bg     background
	lease  leasing
	tpl    templates
	// net is the node's egress plumbing (Options.Egress.Network): every
	// way a sandbox stops resets its connections (resetEgress).
	net *egress.Network
}

// background is the engine's background work; set by Start.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// templates is the template catalog and the lock a version's removal takes
// (template_ops.go: it excludes new sandbox rows).
type templates struct {
	cat *Catalog
	mu  sync.RWMutex
}

// leasing is this node's identity and the leases it holds on sandbox
// streams (holdLease, ownedHere, mine below; failover.go, move.go).
type leasing struct {
	holder string // lease holder: "node/" + nodeID
	nodeID string // Options.Cluster.Node: the value of meta.Sandbox.Node for rows this engine runs
	shared bool
	ttl    time.Duration
	mu     sync.Mutex
	held   map[string]eventlog.Lease // sandbox id → the lease this engine holds on its stream
}

// holdLease renews this engine's lease on sandbox id's stream, or takes one
// if it holds none. It fails with errdefs.ErrFenced when another holder
// took the stream: a fenced node publishes and restores nothing.
func (e *core) holdLease(ctx context.Context, id string) (eventlog.Lease, error) {
	return e.holdStreamLease(ctx, id, Stream(id), "sandbox "+id)
}

// holdStreamLease is holdLease for any stream; key names it in e.lease.held.
func (e *core) holdStreamLease(ctx context.Context, key, stream, what string) (eventlog.Lease, error) {
	e.lease.mu.Lock()
	l, ok := e.lease.held[key]
	e.lease.mu.Unlock()
	var err error
	if ok {
		l, err = e.log.Renew(ctx, l, e.lease.ttl)
	} else {
		l, err = e.log.Acquire(ctx, stream, e.lease.holder, e.lease.ttl)
		if errdefs.IsConflict(err) {
			err = errdefs.Fencedf("%s: another node holds its stream: %v", what, err)
		}
	}
	if err != nil {
		if errdefs.IsFenced(err) {
			e.lease.mu.Lock()
			delete(e.lease.held, key)
			e.lease.mu.Unlock()
		}
		return l, err
	}
	e.lease.mu.Lock()
	e.lease.held[key] = l
	e.lease.mu.Unlock()
	return l, nil
}

// latestCheckpoint returns sandbox id's newest committed checkpoint.
func (e *core) latestCheckpoint(ctx context.Context, id string) (meta.Checkpoint, error) {
	cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{SandboxID: id, States: []meta.CheckpointState{meta.CheckpointCommitted}})
	if err != nil {
		return meta.Checkpoint{}, err
	}
	if len(cks) == 0 {
		return meta.Checkpoint{}, errdefs.NotFoundf("sandbox %s has no checkpoint", id)
	}
	return cks[len(cks)-1], nil
}

// auditSystem records an action the engine took on its own for tenant.
func (e *core) auditSystem(ctx context.Context, tenant, action, resource string, err error) {
	if e.audit == nil || tenant == "" {
		return
	}
	r := audit.Record{Actor: "system", Action: action, Resource: resource, Outcome: "ok"}
	if err != nil {
		r.Outcome, r.Detail = errdefs.Kind(err), err.Error()
		if errdefs.HTTPStatus(err) == http.StatusInternalServerError {
			// The tenant reads its trail: an internal error's text (stores,
			// paths) is the operator's, in the log.
			r.Detail = "internal error"
			e.lg.Error("system action failed", "action", action, "resource", resource, "tenant", tenant, "err", err)
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, aerr := e.audit.Append(actx, tenant, r); aerr != nil {
		e.lg.Error("audit record not written", "action", action, "err", aerr)
	}
}

// NodeID returns the node id this engine runs as (Options.Cluster.Node).
func (e *core) NodeID() string { return e.lease.nodeID }

// mine restricts f to this node's rows when the stores are shared.
func (e *core) mine(f meta.Filter) meta.Filter {
	if e.lease.shared {
		f.Node = &e.lease.nodeID
	}
	return f
}

// ownedHere refuses to act on a sandbox that runs on another node.
func (e *core) ownedHere(sb meta.Sandbox) error {
	if e.lease.shared && sb.Node != e.lease.nodeID {
		return errdefs.Fencedf("sandbox %s runs on node %q, not on this node (%s)", sb.ID, sb.Node, e.lease.nodeID)
	}
	return nil
}

// tenantPolicy returns tenant's recovery policy (meta.TenantPolicy); on a
// read error, the daemon's defaults (and the error is logged).
func (e *core) tenantPolicy(ctx context.Context, tenant string) meta.TenantPolicy {
	p, err := e.meta.TenantPolicy(ctx, tenant)
	if err != nil {
		e.lg.Warn("tenant policy unreadable; using the defaults", "tenant_id", tenant, "err", err)
	}
	return p
}

// suspended: stopped by the engine (idle, or by a lifecycle observer: a
// used-up budget, budget.go) and resumed by the next call.
func (e *core) suspended(sb meta.Sandbox) bool {
	if idleStopped(sb) {
		return true
	}
	for _, o := range e.life {
		if o.suspends(sb) {
			return true
		}
	}
	return false
}

// resetEgress resets sandbox id's connections through the gateway: its side
// of them is gone for good (see egress.Network.ResetConnections).
func (e *core) resetEgress(id, why string) {
	if e.net == nil {
		return
	}
	if n := e.net.ResetConnections(id); n > 0 {
		e.lg.Info("egress connections reset", "sandbox", id, "connections", n, "why", why)
	}
}

// refuse is the refusal of tenant's quota (its meta.TenantQuota field
// name, e.g. "max_sandboxes"): it tells the observer and returns the error.
func (e *core) refuse(tenant, quota, format string, args ...any) error {
	if qo, ok := e.obs.(QuotaObserver); ok {
		qo.QuotaRejected(tenant, quota)
	}
	return errdefs.ResourceExhaustedf(format, args...)
}
