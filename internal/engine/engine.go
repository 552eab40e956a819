// Package engine manages sandboxes: it turns API requests into driver calls,
// records every sandbox in the metadata store (internal/state/meta) before the
// driver makes it, appends lifecycle events to the event log, keeps a warm
// pool per template, and on start reconciles what it recorded with what the
// driver still runs.
//
// # Durability order
//
// Create: meta row (creating) → driver.Create → meta running → events
// sandbox.created + sandbox.started. Destroy: driver.Destroy → meta destroyed
// → sandbox.destroyed. Kill: driver.Kill → meta stopped → sandbox.killed.
// Because the row comes first, a daemon crash at any point leaves a row the
// next start reconciles (Start): a row still "creating" is torn down and
// marked crashed, a "running" row whose sandbox is gone is marked crashed
// with a sandbox.crashed event, one whose sandbox runs is reattached.
//
// # Parts
//
// A small core (core.go) and one type per capability, each in its own
// files with its own dependencies: checkpointer, pool, mover,
// policyRunner, quotas, egressRunner, billing, templateOps (see Engine).
// The warm pool is described in pool.go.
//
// May import: core, lib, internal/state, internal/egress, internal/obs/tracing.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/gateway"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// Options configure New.
type Options struct {
	Driver    sandbox.Driver
	Meta      metadata.Store
	Log       eventlog.Store
	Registry  *eventlog.Registry // lifecycle types are registered into it; default a new one
	Templates *Catalog
	// Pool is the number of warm sandboxes to keep per template name.
	Pool map[string]int
	// WatchInterval is how often running sandboxes are checked for a dead
	// init (default 5s; negative disables the watch).
	WatchInterval time.Duration
	Clock         clock.Clock
	Logger        *slog.Logger

	// Failpoints, when set, are the engine's crash points (tests:
	// FPLocalKept, FPUpload).
	Failpoints *failpoint.Set
	// Checkpoints stores checkpoint images (see checkpoint.go); nil
	// disables checkpoint and restore.
	Checkpoints *chunkstore.Store
	// WorkDir holds images while they are cut or fetched (default: the
	// system's temp dir). It should be on the same disk as the driver's
	// state: images are as large as the sandbox's memory.
	WorkDir string
	// Cluster is this node's place among others (leases, shared stores).
	Cluster ClusterOptions
	// Recovery tunes the recovery policies, retention and idle stops.
	Recovery RecoveryOptions
	// Audit, when set, records what the engine does on its own (idle
	// stops, policy checkpoints, retention) as actor "system".
	Audit *audit.Trail
	// Observer, when set, is told about checkpoints and restores.
	Observer Observer
	// Egress is the node's egress gateway and the policies above tenants'.
	Egress EgressOptions
	// Tracer makes the spans of create, exec, checkpoint and restore
	// (trace.go); nil: no spans.
	Tracer trace.TracerProvider
	// CPUFeatures reports this host's user-visible CPU features, recorded
	// in every checkpoint and required at restore (default
	// HostCPUFeatures; see hostcompat.go).
	CPUFeatures func() ([]string, error)
	// MeterInterval is the metering interval (metering.go; default 10s,
	// negative disables metering).
	MeterInterval time.Duration
}

// ClusterOptions place an engine among other nodes (Options.Cluster).
type ClusterOptions struct {
	// Node names this daemon as the holder of the leases it takes on
	// sandbox streams (default: the host name).
	Node string
	// Shared says the metadata store and the event log are shared with
	// other nodes (PostgreSQL): this engine then manages only the rows
	// whose Node is its own (reconcile, watch, pool, policies, idle
	// stops, metering) and refuses calls into sandboxes that run on
	// another node (errdefs.ErrFenced; the API forwards them to their
	// node). See failover.go and docs/deploy.md.
	Shared bool
	// LeaseTTL is how long a sandbox stream's lease lasts without renewal
	// (default 30s); checkpoint commits renew it.
	LeaseTTL time.Duration
}

// RecoveryOptions tune the recovery policies, retention and idle stops
// (Options.Recovery).
type RecoveryOptions struct {
	// FastEvery and FastInterval tune the fast recovery policy (default
	// 10 execs, 30s; see policy.go).
	FastEvery    int
	FastInterval time.Duration
	// FastReplayBudget (default 5s) is the fast policy's adaptive cut:
	// a checkpoint is also due once the execs since the last one ran
	// this long in all, the time a crash would make the session replay
	// (a few long tool calls are cut sooner than FastEvery, many short
	// ones are not cut more often for it).
	FastReplayBudget time.Duration
	// KeepCheckpoints, when > 0, keeps each sandbox's newest K committed
	// checkpoints plus the tagged ones, deletes the others, and truncates
	// the sandbox's stream below the oldest one kept (see retain).
	KeepCheckpoints int
	// IdleTimeout, when > 0, checkpoints and stops a sandbox after this
	// long without a call into it; the next call resumes it (idle.go).
	IdleTimeout time.Duration
	// DriverTimeout bounds each driver Checkpoint and Restore call (0: 5
	// minutes): a call the kernel holds ends with the call's error and
	// the loop that made it goes on, rather than holding the sandbox's
	// lock for good.
	DriverTimeout time.Duration
	// StartTimeout bounds each attempt of a start-up reconcile (0: 2
	// minutes; see startStep): a store call that hangs ends with the
	// attempt, which is tried again, instead of holding `amber up`.
	StartTimeout time.Duration
	// CutLockTimeout bounds how long a checkpoint's cut or a restore's
	// driver call waits for the calls into its sandbox (an exec, a file
	// transfer) to end (0: 1 minute): then it fails Unavailable and the
	// loop that owns it tries again. A call into the sandbox waits behind
	// a cut for DriverTimeout plus CutLockTimeout (cutlock.go).
	CutLockTimeout time.Duration
	// HotTierBytes bounds the node's hot copies of sandboxes' newest
	// images (hottier.go): 0 is DefaultHotTierBytes, < 0 keeps none (every
	// restore fetches from the chunk store).
	HotTierBytes int64
	// EagerRestore: every restore loads the whole memory before the
	// sandbox runs, even where the driver can restore lazily (lazy.go).
	EagerRestore bool
}

// EgressOptions are the node's egress gateway and the policies above
// tenants' (Options.Egress).
type EgressOptions struct {
	// Gateway, when set, is the node's egress gateway: the engine starts
	// each sandbox's run at create, cut and restore (egress.go). Network
	// is its plumbing (the driver was given it too); the engine reopens a
	// sandbox's sockets after a daemon restart. Default is the policy of
	// sandboxes whose tenant set none (the zero policy reaches nothing).
	Gateway *gateway.Gateway
	Network *egress.Network
	Default meta.EgressPolicy
	// Ceiling, when set, is the operator's egress ceiling: no tenant
	// or sandbox policy reaches beyond it (egress_ceiling.go).
	Ceiling *meta.EgressPolicy
	// TenantCA returns the certificate (PEM) of the CA the gateway signs a
	// tenant's TLS with; it is added to the trust store of the tenant's
	// sandboxes when they are created. Nil: no TLS termination.
	TenantCA func(ctx context.Context, tenant string) ([]byte, error)
}

// Engine is the sandbox manager. It is safe for concurrent use.
//
// Its own methods are the lifecycle (create, kill, destroy, reconcile, the
// calls into a sandbox, upgrades): they orchestrate the capabilities. What
// they share is the core (core.go: driver, stores, the per-sandbox lock,
// the event log, leases). Each capability is a type of its own that holds
// the core and, as named fields, only the capabilities it calls:
//
//   - checkpointer: checkpoints, restores, their GC and the hot tier
//     (checkpoint.go, restore.go, gc.go, hostcompat.go, hottier.go,
//     upload.go); calls
//     egressRunner and quotas.
//   - pool: the warm pool (pool.go); creates and destroys through the
//     lifecycle's functions it is given (poolDeps).
//   - mover: failover and moves (failover.go, move.go); calls
//     checkpointer and policyRunner.
//   - policyRunner: recovery policies and idle stops (policy.go, idle.go);
//     calls checkpointer and egressRunner.
//   - quotas: tenants' quotas (quota.go).
//   - egressRunner: sandboxes' egress runs and the ceiling (egress.go,
//     egress_ceiling.go).
//   - billing: metering and budgets (metering.go, metering_counts.go,
//     budget.go); calls checkpointer.
//   - templateOps: template management (template_ops.go); reads the pool.
//
// Engine embeds them, so their exported methods are the Engine's. Metering
// and budgets watch the lifecycle through hooks (lifecycle.go): the
// checkpoint and restore code does not call them. TestEngineHouseRules
// keeps the house so.
type Engine struct {
	*core
	*checkpointer
	*pool
	*mover
	*policyRunner
	*quotas
	*egressRunner
	*billing
	*templateOps
	watch time.Duration
	// startTimeout bounds each attempt of a start-up step (startStep).
	startTimeout time.Duration
}

// New returns an Engine. Call Start before serving requests.
func New(o Options) (*Engine, error) {
	if o.Driver == nil || o.Meta == nil || o.Log == nil || o.Templates == nil {
		return nil, errdefs.InvalidArgumentf("engine: driver, meta, log and templates are required")
	}
	if o.Registry == nil {
		o.Registry = eventlog.NewRegistry()
	}
	RegisterEvents(o.Registry)
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.WatchInterval == 0 {
		o.WatchInterval = 5 * time.Second
	}
	if o.WorkDir == "" {
		o.WorkDir = os.TempDir()
		// No hot tier in a directory other processes share.
		o.Recovery.HotTierBytes = -1
	}
	if o.Cluster.Node == "" {
		o.Cluster.Node, _ = os.Hostname()
		if o.Cluster.Node == "" {
			o.Cluster.Node = "amber"
		}
	}
	if o.Cluster.LeaseTTL <= 0 {
		o.Cluster.LeaseTTL = 30 * time.Second
	}
	if o.Recovery.FastEvery <= 0 {
		o.Recovery.FastEvery = 10
	}
	if o.Recovery.FastInterval <= 0 {
		o.Recovery.FastInterval = 30 * time.Second
	}
	if o.Recovery.FastReplayBudget <= 0 {
		o.Recovery.FastReplayBudget = 5 * time.Second
	}
	if o.Recovery.DriverTimeout <= 0 {
		o.Recovery.DriverTimeout = 5 * time.Minute
	}
	if o.Recovery.StartTimeout <= 0 {
		o.Recovery.StartTimeout = 2 * time.Minute
	}
	if o.Recovery.CutLockTimeout <= 0 {
		o.Recovery.CutLockTimeout = time.Minute
	}
	c := &core{drv: o.Driver, meta: o.Meta, log: o.Log, reg: o.Registry,
		clock: o.Clock, lg: o.Logger, audit: o.Audit, obs: o.Observer, net: o.Egress.Network,
		tracer: tracing.OrNoop(o.Tracer).Tracer(tracing.ScopeEngine)}
	c.tpl.cat = o.Templates
	c.cuts = cutLocks{cutWait: o.Recovery.CutLockTimeout, callWait: o.Recovery.DriverTimeout + o.Recovery.CutLockTimeout}
	c.lease = leasing{holder: "node/" + o.Cluster.Node, nodeID: o.Cluster.Node, shared: o.Cluster.Shared, ttl: o.Cluster.LeaseTTL, held: map[string]eventlog.Lease{}}
	e := &Engine{core: c, watch: o.WatchInterval, startTimeout: o.Recovery.StartTimeout, quotas: &quotas{core: c}}
	e.egressRunner = &egressRunner{core: c, egr: egressRuns{gw: o.Egress.Gateway, def: o.Egress.Default, ceiling: o.Egress.Ceiling, tenantCA: o.Egress.TenantCA}}
	e.checkpointer = &checkpointer{core: c, eg: e.egressRunner, qt: e.quotas,
		ck: checkpointing{store: o.Checkpoints, workDir: o.WorkDir, keep: o.Recovery.KeepCheckpoints,
			hot: newHotTier(o.WorkDir, o.Recovery.HotTierBytes, o.Logger), drvTimeout: o.Recovery.DriverTimeout, fps: o.Failpoints,
			eager: o.Recovery.EagerRestore}}
	e.policyRunner = &policyRunner{core: c, ckr: e.checkpointer, eg: e.egressRunner,
		pol: policies{fastEvery: o.Recovery.FastEvery, fastInterval: o.Recovery.FastInterval,
			replayBudget: o.Recovery.FastReplayBudget, idle: o.Recovery.IdleTimeout}}
	e.mover = &mover{core: c, ckr: e.checkpointer, idle: e.policyRunner}
	e.ck.cpuFeatures = o.CPUFeatures
	if e.ck.cpuFeatures == nil {
		e.ck.cpuFeatures = HostCPUFeatures
	}
	for name := range o.Pool {
		if _, err := o.Templates.Get(name); err != nil {
			return nil, fmt.Errorf("warm pool: %w", err)
		}
	}
	e.pool = newPool(&poolDeps{core: c, coldCreate: e.coldCreate, destroy: e.destroy, startRun: e.egressRunner.startRun}, o.Pool)
	e.templateOps = &templateOps{core: c, warm: e.pool}
	e.billing = &billing{core: c, ckr: e.checkpointer}
	e.mtr.init(o.MeterInterval)
	e.observe(meterHooks{e.billing})
	e.observe(budgetHooks{e.billing})
	return e, nil
}

// Driver returns the engine's driver.
func (e *Engine) Driver() sandbox.Driver { return e.drv }

// Templates returns the template catalog.
func (e *Engine) Templates() *Catalog { return e.tpl.cat }

// SetTenantQuota sets tenant's quota (the operator's call). It is the
// Engine's, not quotas': billing recomputes the tenant's budget state.
func (e *Engine) SetTenantQuota(ctx context.Context, tenant string, q meta.TenantQuota) error {
	if err := checkBudgetNames(q); err != nil {
		return err
	}
	if err := e.meta.SetTenantQuota(ctx, tenant, q); err != nil {
		return err
	}
	_, err := e.refreshBudget(ctx, tenant)
	return err
}

// startStep runs one step of Start, again with backoff (100 ms doubling
// to 5 s) while it fails with an error a retry may cure — a store that
// answered one read with an error, a database restarting — until ctx ends:
// a daemon heals from a transient fault at start instead of exiting. Both
// reconciles are idempotent (each compares what is recorded with what
// runs and converges), so a step that failed half-way is run whole again.
// A lasting error (fenced, data loss, invalid, denied, failed
// precondition) ends Start at once.
//
// Each attempt has a deadline, RecoveryOptions.StartTimeout (2 minutes:
// one pass over a node's rows takes seconds when the stores answer): a
// store or driver call that hangs — a database that stopped answering —
// ends with the attempt's context, and the attempt counts as failed and
// is tried again (TestStartSurvivesAHungStore). The stores end a call
// when its context does (database/sql, the event log's); a call that
// ignored its context would still hold the attempt.
func (e *Engine) startStep(ctx context.Context, name string, step func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, e.startTimeout)
		err := step(actx)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (the attempt's deadline, %v, passed)", err, e.startTimeout)
		}
		cancel()
		if err == nil || lastingStartError(err) {
			return err
		}
		e.lg.Warn("start: a step failed; trying it again", "step", name, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (gave up after %d attempts: %v)", name, err, attempt, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// lastingStartError reports whether err is of a kind a retry cannot cure.
func lastingStartError(err error) bool {
	return errdefs.IsFenced(err) || errdefs.IsDataLoss(err) || errdefs.IsInvalidArgument(err) ||
		errors.Is(err, errdefs.ErrPermissionDenied) || errors.Is(err, errdefs.ErrFailedPrecondition)
}

// Start reconciles the metadata with the driver (see reconcile.go), then
// starts the warm pool and the watch loop. It returns once reconciliation is
// done (each reconcile tried again while its errors are transient:
// startStep); the pool fills in the background.
func (e *Engine) Start(ctx context.Context) error {
	if err := e.startStep(ctx, "reconcile sandboxes", e.reconcile); err != nil {
		return err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.bg.cancel, e.bg.ctx = cancel, bg
	if err := e.startStep(ctx, "reconcile checkpoints", e.reconcileCheckpoints); err != nil {
		cancel()
		return err
	}
	if err := e.startStep(ctx, "reconcile uploads", e.reconcileUploads); err != nil {
		cancel()
		return err
	}
	e.pushAheadRecorded(ctx)
	e.pool.start(bg)
	if e.ck.store != nil {
		e.bg.wg.Add(1)
		go func() {
			defer e.bg.wg.Done()
			e.policyLoop(bg)
		}()
		// Always: a tenant's policy may set an idle timeout.
		e.bg.wg.Add(1)
		go func() {
			defer e.bg.wg.Done()
			e.idleLoop(bg)
		}()
	}
	e.bg.wg.Add(1)
	go func() {
		defer e.bg.wg.Done()
		e.expiryLoop(bg)
	}()
	if e.mtr.every > 0 {
		e.bg.wg.Add(1)
		go func() {
			defer e.bg.wg.Done()
			e.meterLoop(bg)
		}()
	}
	if e.watch > 0 {
		e.bg.wg.Add(1)
		go func() {
			defer e.bg.wg.Done()
			e.watchLoop(bg)
		}()
	}
	return nil
}

// Close stops the background work and destroys the pooled sandboxes that
// are waiting (they belong to nobody). Tenants' sandboxes keep running: the
// next daemon reattaches them.
func (e *Engine) Close(ctx context.Context) error {
	if e.bg.cancel != nil {
		e.bg.cancel()
	}
	e.bg.wg.Wait()
	e.waitUploads()
	e.ck.hot.wait()
	return e.pool.drain(ctx, "warm pool drained at shutdown")
}

func (e *core) lock(id string) func() {
	m, _ := e.locks.LoadOrStore(id, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// tryLock is lock without waiting: ok is false when another operation holds
// sandbox id's lock.
func (e *core) tryLock(id string) (unlock func(), ok bool) {
	m, _ := e.locks.LoadOrStore(id, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, false
	}
	return mu.Unlock, true
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns a fresh sandbox id: "sbx-" and 16 random base32 characters.
func newID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "sbx-" + idEncoding.EncodeToString(b)
}

// Get returns sandbox id if tenant may see it. Pooled sandboxes and other
// tenants' sandboxes are not found.
func (e *core) Get(ctx context.Context, tenant, id string) (meta.Sandbox, error) {
	if id == "" || len(id) > 48 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return meta.Sandbox{}, errdefs.InvalidArgumentf("sandbox id %.60q is malformed", id)
	}
	sb, err := e.meta.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if sb.Pooled || sb.Tenant != tenant {
		return meta.Sandbox{}, errdefs.NotFoundf("sandbox %s", id)
	}
	return sb, nil
}

// List returns tenant's sandboxes that are not destroyed, oldest first.
func (e *Engine) List(ctx context.Context, tenant string) ([]meta.Sandbox, error) {
	return e.meta.List(ctx, meta.Filter{Tenant: &tenant})
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	Tenant   string
	Template string
	Limits   sandbox.Limits // zero fields: the template's defaults
	Env      []string
	// Cold bypasses the warm pool.
	Cold bool
	// Policy is the recovery policy: "", "none", "fast" or "strict".
	Policy string
	// Egress is the sandbox's own egress policy (nil: its tenant's).
	Egress *meta.EgressPolicy
	// Metadata are the sandbox's labels; Timeout, when > 0, its deadline
	// from now, and OnTimeout what happens then: "" or "kill", "pause"
	// (ttl.go).
	Metadata  map[string]string
	Timeout   time.Duration
	OnTimeout string
	// ReservedLabels lets Metadata hold Amber's own labels (keys beginning
	// ReservedLabelPrefix, labels.go). Only Amber's own callers set it (the
	// session harness); never an edge, from a request.
	ReservedLabels bool
}

// Create returns a running sandbox for r: one claimed from the warm pool
// when a compatible one is ready (see pool.go), else a new one.
func (e *Engine) Create(ctx context.Context, r CreateRequest) (sb meta.Sandbox, err error) {
	ctx, span := e.span(ctx, "engine.create", r.Tenant, "", tracing.Template.String(r.Template))
	defer func() {
		if sb.ID != "" {
			span.SetAttributes(tracing.SandboxID.String(sb.ID))
		}
		tracing.End(span, err)
	}()
	if r.Tenant == "" {
		return meta.Sandbox{}, errdefs.InvalidArgumentf("create: tenant is empty")
	}
	t, err := e.tpl.cat.Get(r.Template)
	if err != nil {
		return meta.Sandbox{}, err
	}
	if err := ValidateLimits(r.Limits); err != nil {
		return meta.Sandbox{}, err
	}
	if r.Policy == "" {
		r.Policy = e.tenantPolicy(ctx, r.Tenant).Recovery
	}
	if err := ValidatePolicy(r.Policy); err != nil {
		return meta.Sandbox{}, err
	}
	r.Policy = normPolicy(r.Policy)
	if r.Policy != PolicyNone {
		if _, err := e.checkpointStore(); err != nil {
			return meta.Sandbox{}, fmt.Errorf("recovery policy %s: %w", r.Policy, err)
		}
	}
	for _, kv := range r.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return meta.Sandbox{}, errdefs.InvalidArgumentf("env entry %.60q is not KEY=VALUE", kv)
		}
	}
	if err := e.checkAnnotations(r); err != nil {
		return meta.Sandbox{}, err
	}
	if r.Egress != nil {
		if err := r.Egress.Check(); err != nil {
			return meta.Sandbox{}, err
		}
		if err := e.checkSandboxEgress(ctx, r.Tenant, r.Egress); err != nil {
			return meta.Sandbox{}, err
		}
	}
	limits := MergeLimits(t.Limits, r.Limits)
	release, err := e.reserveSandbox(ctx, r.Tenant, limits)
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer release()
	claimed := false
	if !r.Cold && !strings.ContainsAny(r.Template, "@:") { // the pool holds the tags' versions
		sb, claimed, err = e.pool.claim(ctx, t, r.Tenant, limits, r.Env, r.Metadata)
		if err == nil && claimed && r.Policy != PolicyNone {
			sb, err = e.meta.SetPolicy(ctx, sb.ID, r.Policy)
		}
		if err != nil {
			return sb, err
		}
	}
	if !claimed {
		if sb, err = e.coldCreate(ctx, t, r.Tenant, limits, r.Env, false, r.Policy, r.Metadata); err != nil {
			return sb, err
		}
	}
	if err := e.installCA(ctx, sb); err != nil {
		return sb, err
	}
	if r.Egress != nil {
		// Before the caller gets the sandbox, so nothing it runs sees the
		// default policy.
		if err := e.meta.SetSandboxEgress(ctx, sb.ID, r.Egress); err != nil {
			return sb, err
		}
		if err := e.startRun(ctx, sb, startRunID(sb.ID), false); err != nil {
			return sb, err
		}
	}
	e.pushAhead(sb)
	return e.annotate(ctx, sb, r)
}

// coldCreate makes a new sandbox; pooled ones have no tenant and no events.
// Its labels (md) are in its row from the start: a caller that dies, or
// gets an error, after the sandbox runs finds it by them (List), as the
// session harness does.
func (e *Engine) coldCreate(ctx context.Context, t sandbox.Template, tenant string, limits sandbox.Limits, env []string, pooled bool, policy string, md map[string]string) (meta.Sandbox, error) {
	id := newID()
	defer e.lock(id)()
	e.tpl.mu.RLock()
	sb, err := e.meta.Insert(ctx, meta.Sandbox{Node: e.lease.nodeID,
		ID: id, Tenant: tenant, Template: t.Name, TemplateVersion: t.Version, Driver: e.drv.Name(),
		Limits: limits, Env: env, State: meta.StateCreating, Pooled: pooled, Policy: policy, Metadata: md,
	})
	e.tpl.mu.RUnlock()
	if err != nil {
		return sb, err
	}
	lg := e.lg.With("sandbox_id", id, "template", t.Name, "pooled", pooled)
	start := time.Now()
	_, err = e.drv.Create(ctx, sandbox.Spec{ID: id, Tenant: tenant, Template: t, Limits: limits, Env: env})
	if err != nil {
		lg.WarnContext(ctx, "create failed", "err", err)
		cleanup := context.WithoutCancel(ctx)
		if derr := e.drv.Destroy(cleanup, id); derr != nil {
			lg.Error("destroy after failed create", "err", derr)
		}
		if _, merr := e.meta.SetState(cleanup, id, meta.StateDestroyed, "create failed: "+err.Error()); merr != nil {
			lg.Error("record failed create", "err", merr)
		}
		return sb, fmt.Errorf("create sandbox from %s: %w", t.Name, err)
	}
	if err := e.prepareEgress(ctx, id); err != nil {
		lg.Warn("egress setup failed", "err", err)
		cleanup := context.WithoutCancel(ctx)
		if derr := e.drv.Destroy(cleanup, id); derr != nil {
			lg.Error("destroy after failed create", "err", derr)
		}
		_, _ = e.meta.SetState(cleanup, id, meta.StateDestroyed, "create failed: "+err.Error())
		return sb, err
	}
	// The sandbox runs: its row, its egress run and its events are retried
	// through a store error window (storeRetry). Giving up here left a
	// running sandbox recorded "creating" — no one's until the next start
	// — and the caller made another.
	if err := e.storeRetry(ctx, "record the created sandbox", func(ctx context.Context) (err error) {
		sb, err = e.meta.SetState(ctx, id, meta.StateRunning, "", meta.StateCreating, meta.StateRunning) // a retry after an applied attempt
		return err
	}); err != nil {
		return sb, err
	}
	if err := e.storeRetry(ctx, "start the sandbox's egress run", func(ctx context.Context) error {
		return e.startRun(ctx, sb, startRunID(id), false)
	}); err != nil {
		return sb, err
	}
	if err := e.storeRetry(ctx, "append the sandbox's created events", func(ctx context.Context) error {
		return e.appendEvents(ctx, sb, createdEvents(sb)...)
	}); err != nil {
		// The sandbox runs and is recorded; the log will get its events
		// when the call is retried through reconcile. Tell the caller.
		return sb, err
	}
	lg.InfoContext(ctx, "sandbox created", "tenant_id", tenant, "took", time.Since(start).Round(time.Millisecond))
	return sb, nil
}

// Destroy removes sandbox id and everything of it. Destroying a destroyed
// sandbox succeeds.
func (e *Engine) Destroy(ctx context.Context, tenant, id string) error {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	defer e.lock(id)()
	if sb, err = e.meta.Get(ctx, id); err != nil {
		return err
	}
	if err := e.ownedHere(sb); err != nil && sb.State != meta.StateDestroyed {
		return err
	}
	return e.destroy(ctx, sb, "destroyed on request")
}

func (e *Engine) destroy(ctx context.Context, sb meta.Sandbox, reason string) error {
	if sb.State != meta.StateDestroyed {
		e.stopping(ctx, sb.ID)
		if err := e.drv.Destroy(ctx, sb.ID); err != nil {
			return fmt.Errorf("destroy %s: %w", sb.ID, err)
		}
		var err error
		if sb, err = e.meta.SetState(ctx, sb.ID, meta.StateDestroyed, reason); err != nil {
			return err
		}
		if e.egr.gw != nil {
			e.egr.gw.EndSandbox(sb.ID)
		}
		e.lg.Info("sandbox destroyed", "sandbox_id", sb.ID, "reason", reason)
	}
	if err := e.meta.DeleteExposures(ctx, sb.ID); err != nil {
		return err
	}
	return e.appendEvents(ctx, sb, lifecycleEvent(sb, EventDestroyed, StatePayload{State: string(meta.StateDestroyed), Reason: sb.Reason}))
}

// Kill SIGKILLs every process of sandbox id; it becomes stopped and keeps
// its files until destroyed.
func (e *Engine) Kill(ctx context.Context, tenant, id string) (meta.Sandbox, error) {
	return e.kill(ctx, tenant, id, "killed on request")
}

func (e *Engine) kill(ctx context.Context, tenant, id, reason string) (meta.Sandbox, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	defer e.lock(id)()
	if sb, err = e.meta.Get(ctx, id); err != nil {
		return sb, err
	}
	if err := e.ownedHere(sb); err != nil {
		return sb, err
	}
	if sb.State != meta.StateRunning {
		return sb, errdefs.FailedPreconditionf("sandbox %s is %s, not running", id, sb.State)
	}
	e.stopping(ctx, id)
	if err := e.drv.Kill(ctx, id); err != nil {
		return sb, fmt.Errorf("kill %s: %w", id, err)
	}
	e.resetEgress(id, reason)
	if sb, err = e.meta.SetState(ctx, id, meta.StateStopped, reason, meta.StateRunning); err != nil {
		return sb, err
	}
	return sb, e.appendEvents(ctx, sb, lifecycleEvent(sb, EventKilled, StatePayload{State: string(sb.State), Reason: reason}))
}
