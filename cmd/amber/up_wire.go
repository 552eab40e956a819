package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/console"
	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/cluster"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/host/faults"
	"github.com/amber-run/amber/internal/host/fence"
	"github.com/amber-run/amber/internal/host/takeover"
	"github.com/amber-run/amber/internal/obs/metrics"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/internal/state/secretstore"
	"github.com/amber-run/amber/lib/failpoint"
	"github.com/amber-run/amber/lib/httpx"
	"github.com/amber-run/amber/stores/postgres"
	"github.com/amber-run/amber/stores/sqlite"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// The steps of amber up (runUp, up.go), in the order they run. Each step
// reads what the steps before it set in the upDaemon and sets its own part;
// what a step must undo on the way out it registers with d.atExit, and
// runUp undoes it all, last first, as the defers of one function would:
// the sessions before the engine, the engine before the gateway and the
// stores, the stores before the data dir's lock.

// upDaemon is amber up as it is wired.
type upDaemon struct {
	g  *globalFlags
	o  *upOptions
	lg *slog.Logger
	tp *tracing.Provider

	undo []func() // run last first by close

	// lockDataDir
	dataDir    string
	takingOver bool // the lock's holder is alive (stopped, hung)

	// openDriver
	hosts         map[string]netip.Addr
	defEgress     meta.EgressPolicy
	egressCeiling *meta.EgressPolicy
	enet          *egress.Network
	drv           sandbox.Driver
	fps           *failpoint.Set

	// openMeta, openLog
	m          metadata.Store
	keyPath    string
	host       string
	nodeName   string
	log        eventlog.Store
	pgLog      *postgres.Store             // the shared log: leases are taken over on it
	fenceCheck func(context.Context) error // the data-dir lease, for the gateway (nil: shared stores)

	// openCheckpoints
	ckpts   *chunkstore.Store
	bs      blob.Store
	workDir string
	cat     *engine.Catalog
	pool    map[string]int

	// openObservers
	mx       *metrics.Metrics
	tlog     eventlog.Store
	reg      *eventlog.Registry
	trail    *audit.Trail
	hop      *httpx.Hop
	serveTLS *tls.Config

	// startGateway
	gw       *gateway.Gateway
	meterTo  atomic.Pointer[engine.Engine] // set once the engine exists
	secrets  *secretstore.Store
	tenantCA func(context.Context, string) ([]byte, error)

	// startEngine, startSessions
	eng      *engine.Engine
	node     *cluster.Node
	sessions *session.Manager
}

// atExit registers f to run on the way out, before what was registered
// earlier.
func (d *upDaemon) atExit(f func()) { d.undo = append(d.undo, f) }

// close runs what the steps registered, last first.
func (d *upDaemon) close() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
}

// lockDataDir makes the data dir and takes its lock; with --take-over a
// lock held by a live daemon is noted (takingOver) and the data-dir lease
// decides later (openLog).
func (d *upDaemon) lockDataDir() error {
	g, o, lg := d.g, d.o, d.lg
	dataDir, err := filepath.Abs(g.resolvedDataDir())
	if err != nil {
		return err
	}
	d.dataDir = dataDir
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := o.shared.resolve(o.addr); err != nil {
		return err
	}
	if o.takeOver && o.shared.shared() {
		return usageError{fmt.Errorf("--take-over is for a daemon on its own data dir; nodes on shared stores (--store) are fenced by their node lease")}
	}
	unlock, err := lockDataDir(dataDir)
	d.takingOver = err != nil && o.takeOver // the lock's holder is alive (stopped, hung)
	switch {
	case err != nil && o.takeOver:
		// The holder of the lock is alive (stopped, hung): the data-dir
		// lease decides, below.
		lg.Warn("data dir is locked; taking it over once the other daemon's lease expires", "data_dir", dataDir, "err", err)
	case err != nil:
		return fmt.Errorf("%w\nfix: stop it, or start with --take-over if it is hung (it is fenced once its lease expires)", err)
	default:
		d.atExit(unlock)
	}
	if o.leaseTTL < time.Second {
		return usageError{fmt.Errorf("--lease-ttl %s: at least 1s", o.leaseTTL)}
	}
	return nil
}

// openDriver checks the egress flags, makes the egress network (gvisor)
// and the driver, checks the driver is ready, and arms the test
// failpoints. It runs before any state is touched: a missing runtime or
// template is the operator's to fix, with the command named.
func (d *upDaemon) openDriver(ctx context.Context) error {
	o, lg := d.o, d.lg
	var err error
	if d.hosts, err = parseHosts(o.egress.hosts); err != nil {
		return err
	}
	if d.defEgress, err = defaultEgress(o.egress.allow); err != nil {
		return err
	}
	if d.egressCeiling, err = ceilingEgress(o.egress.ceiling); err != nil {
		return err
	}
	if o.egress.enabled {
		if d.enet, err = newEgressNetwork(d.dataDir, lg); err != nil {
			return err
		}
		d.atExit(func() { d.enet.Close() })
	}
	d.drv, err = newDriver(o.driver, d.dataDir, cacheDir(), d.enet, o.shared.cgroupParent(o.driver), lg)
	if err != nil {
		return err
	}
	if err := d.drv.Check(ctx); err != nil {
		// The driver's message names the command that fixes it.
		return fmt.Errorf("driver %s is not ready: %w", o.driver, err)
	}
	// Sandboxes left running by a daemon whose data dir is gone belong to
	// nobody: they go before this node starts taking new ones.
	if sw, ok := d.drv.(sandbox.OrphanSweeper); ok {
		killed, err := sw.SweepOrphans(ctx)
		for _, k := range killed {
			lg.Warn("killed an orphan sandbox: its data directory is gone", "what", k)
		}
		if err != nil {
			lg.Warn("orphan sweep", "err", err)
		}
	}
	// Test and chaos runs only (AMBER_TEST_FAILPOINTS); nil otherwise.
	fps, err := testFailpoints(d.drv, lg)
	if err != nil {
		return usageError{err}
	}
	d.fps = fps
	if fs, ok := d.drv.(interface{ SetFailpoints(*failpoint.Set) }); ok && fps != nil {
		fs.SetFailpoints(fps) // the drivers' own points: layer.archive.* while a cut is frozen
	}
	d.atExit(func() { writeFailpointCounts(fps) })
	return nil
}

// openDB opens a database of the data dir; taking over, it may have to
// end a holder stopped inside a write transaction (internal/host/takeover).
func (d *upDaemon) openDB(ctx context.Context, what string) func(open func() error) error {
	return func(open func() error) error {
		if !d.takingOver {
			return open()
		}
		_, err := takeover.Open(ctx, what, filepath.Join(d.dataDir, "daemon.lock"), d.o.leaseTTL, d.lg, func() (struct{}, error) { return struct{}{}, open() })
		return err
	}
}

// openMeta opens the metadata store, makes sure there is an admin key and
// names the node.
func (d *upDaemon) openMeta(ctx context.Context) error {
	o, lg := d.o, d.lg
	var m metadata.Store
	if err := d.openDB(ctx, "meta.db")(func() (err error) {
		m, err = sqlmeta.Open(o.shared.metaSpec(d.dataDir), sqlmeta.Options{Failpoints: d.fps})
		return err
	}); err != nil {
		return err
	}
	d.m = m
	d.atExit(func() { m.Close() })
	var keyPath string
	created := false
	err := startRetry(ctx, lg, "admin key", func(ctx context.Context) error {
		p, c, err := ensureAdminKey(ctx, m, d.dataDir, o.shared.shared())
		keyPath, created = p, created || c
		return err
	})
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	d.keyPath = keyPath
	if created {
		lg.Info("wrote a new admin API key", "path", keyPath)
	}
	d.host, _ = os.Hostname()
	d.nodeName = o.shared.nodeID // what the engine's Options.Cluster.Node becomes
	if d.nodeName == "" {
		if d.nodeName = d.host; d.nodeName == "" {
			d.nodeName = "amber"
		}
	}
	return nil
}

// openLog opens the event log: the shared PostgreSQL log of a node, or the
// data dir's SQLite log behind its data-dir lease (taken over, with the
// previous daemon's stream leases swept, under --take-over).
func (d *upDaemon) openLog(ctx context.Context) error {
	o, lg, m, fps := d.o, d.lg, d.m, d.fps
	var err error
	if o.shared.shared() {
		// Nodes on shared stores are fenced by their node lease
		// (internal/cluster), not by a data-dir lease.
		if d.pgLog, err = openSharedLog(ctx, o.shared.store, lg); err != nil {
			return err
		}
		pgLog := d.pgLog
		d.atExit(func() { pgLog.Close() })
		d.log = faults.Log(pgLog, fps)
		return nil
	}
	var sqlog *sqlite.Store
	if err := d.openDB(ctx, "events.db")(func() (err error) {
		sqlog, err = sqlite.Open(filepath.Join(d.dataDir, "events.db"), sqlite.Options{Logger: lg.With("component", "eventlog")})
		return err
	}); err != nil {
		return err
	}
	d.atExit(func() { sqlog.Close() })
	// The data-dir lease (internal/host/fence): every write to the log
	// checks it first, so a daemon that was paused and taken over
	// writes nothing.
	var dl *fence.Lease
	err = d.openDB(ctx, "events.db")(func() (err error) {
		dl, err = fence.Take(ctx, sqlog, fence.Options{Holder: "daemon/" + d.host, TTL: o.leaseTTL, TakeOver: o.takeOver,
			Waiting: func(cur eventlog.Lease) {
				lg.Warn("waiting for the other daemon's data-dir lease to expire", "epoch", cur.Epoch, "expires", cur.Expires)
			},
			OnFenced: func(err error) {
				// Exit at once, without cleanup: the sandboxes, the pool
				// and the data dir are the new daemon's.
				lg.Error("fenced: another daemon took this data dir over; exiting without touching anything", "err", err)
				os.Exit(exitFenced)
			}})
		return err
	})
	if err != nil {
		return err
	}
	if o.takeOver {
		var n int
		err := startRetry(ctx, lg, "sweep stream leases", func(ctx context.Context) (err error) {
			n, err = sweepLeases(ctx, sqlog, m, engine.LeaseHolder(d.nodeName))
			return err
		})
		if err != nil {
			return err
		}
		lg.Warn("took the data dir over", "epoch", dl.Epoch(), "streams_fenced", n)
	}
	go dl.Keep(ctx)
	d.fenceCheck = dl.Check
	d.log = dl.Log(faults.Log(sqlog, fps)) // faults: sqlog itself unless failpoints are armed
	return nil
}

// openCheckpoints opens the checkpoint store on the blob store and the
// template catalog, and reads the warm pool's sizes.
func (d *upDaemon) openCheckpoints(ctx context.Context) error {
	o, lg := d.o, d.lg
	if o.keep < 0 {
		return usageError{fmt.Errorf("--keep-checkpoints %d: must be 0 (keep all) or more", o.keep)}
	}
	var err error
	d.ckpts, d.bs, d.workDir, err = openCheckpointStore(ctx, d.dataDir, o.blobs, o.shared.masterKeyFile, d.fps, lg)
	if err != nil {
		return err
	}
	// Template versions: cached under DATA_DIR/templates, stored in the
	// blob store; the setup scripts' templates are adopted at first use.
	tdir := filepath.Join(cacheDir(), "templates")
	d.cat, err = engine.NewCatalog(engine.CatalogOptions{Dir: tdir, Root: filepath.Join(d.dataDir, "templates"),
		Blobs: d.bs, Chunks: d.ckpts, Logger: lg.With("component", "templates")})
	if err != nil {
		return err
	}
	if len(d.cat.Names()) == 0 {
		return fmt.Errorf("no templates under %s\nfix: run `make setup` (as root) in the amber source tree; it builds the minimal and python templates", tdir)
	}
	d.pool, err = parsePool(o.pool, d.cat.Names())
	return err
}

// openObservers sets up the metrics (and the timed log), the event
// registry, the audit trail, and the nodes' hop credential and TLS.
func (d *upDaemon) openObservers() error {
	o, lg := d.o, d.lg
	d.mx = metrics.New(d.m)
	d.tlog = d.mx.Log(d.log) // appends timed for amber_log_append_seconds
	d.reg = eventlog.NewRegistry()
	audit.RegisterEvents(d.reg)
	var err error
	if d.trail, err = openAudit(d.tlog, d.dataDir, o.auditKeyFile, o.shared); err != nil {
		return err
	}
	if d.hop, err = nodeHop(o.nodeTokenFile); err != nil {
		return err
	}
	serveTLS, peersTLS, err := nodeTLS(o.tlsCert, o.tlsKey, o.nodeCA)
	if err != nil {
		return err
	}
	d.serveTLS = serveTLS
	d.hop.TLS = peersTLS
	if o.shared.shared() && d.hop.Token == "" {
		lg.Warn("calls forwarded between nodes are not authenticated: give every node and API server the same --node-token-file")
	}
	return nil
}

// startGateway starts the egress gateway with the tenants' secrets, when
// there is an egress network.
func (d *upDaemon) startGateway(ctx context.Context) error {
	if d.enet == nil {
		return nil
	}
	o := d.o
	roots, err := upstreamRoots(o.egress.caFiles)
	if err != nil {
		return err
	}
	key, err := loadMasterKey(d.dataDir, o.shared.masterKeyFile, chunkstore.MasterKeySize)
	if err != nil {
		return err
	}
	if d.secrets, err = secretstore.New(d.m, key); err != nil {
		return err
	}
	d.gw = newGateway(ctx, d.tlog, d.reg, d.trail, d.hosts, o.egress.journal, d.fps, d.fenceCheck, d.secrets, roots, d.tp, d.lg, &d.meterTo, d.mx)
	d.tenantCA = d.secrets.CACert
	gw := d.gw
	d.atExit(func() { gw.Close() })
	d.enet.SetServer(gw)
	return nil
}

// startEngine makes the engine; on shared stores the node registers (a new
// lease epoch) before the engine reconciles its rows, and heartbeats and
// watches the others after.
func (d *upDaemon) startEngine(ctx context.Context) error {
	o, lg := d.o, d.lg
	hotTier := int64(-1)
	if o.hotTier != "off" {
		var err error
		if hotTier, err = parseSize(o.hotTier); err != nil {
			return fmt.Errorf("--hot-tier: %w", err)
		}
	}
	eng, err := engine.New(engine.Options{
		Driver:        d.drv,
		Meta:          d.m,
		Log:           d.tlog,
		Registry:      d.reg,
		Templates:     d.cat,
		Observer:      d.mx,
		Pool:          d.pool,
		WatchInterval: o.watch,
		Logger:        lg.With("component", "engine"),
		Checkpoints:   d.ckpts,
		WorkDir:       d.workDir,
		Audit:         d.trail,
		Tracer:        d.tp,
		MeterInterval: o.meterInterval,
		Egress:        engine.EgressOptions{Gateway: d.gw, Network: d.enet, Default: d.defEgress, Ceiling: d.egressCeiling, TenantCA: d.tenantCA},
		Recovery:      engine.RecoveryOptions{KeepCheckpoints: o.keep, IdleTimeout: o.idle, HotTierBytes: hotTier, EagerRestore: !o.lazyRestore},
		Cluster:       engine.ClusterOptions{Node: o.shared.nodeID, Shared: o.shared.shared()},
		Failpoints:    d.fps, // tests only (driver.checkpoint, driver.restore, checkpoint.*); nil otherwise
	})
	if err != nil {
		return err
	}
	d.eng = eng
	d.meterTo.Store(eng) // the gateway's decisions are metered from here on
	var node *cluster.Node
	if o.shared.shared() {
		node, err = cluster.Join(ctx, cluster.Options{Meta: d.m, Engine: eng, Leases: d.pgLog, Addr: o.shared.advertise,
			TTL: o.shared.ttl, Heartbeat: o.shared.heartbeat, Capacity: nodeCapacity(d.m, eng, d.cat.Names(), o.shared.maxSandboxes),
			Logger: lg.With("component", "cluster"), Failpoints: d.fps})
		if err != nil {
			return err
		}
	}
	d.node = node
	if err := eng.Start(ctx); err != nil {
		return err
	}
	if node != nil {
		node.Run(ctx)
		// Stopped first (undone last first): a clean stop leaves the
		// node's sandboxes running and marks it left, not dead.
		d.atExit(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			node.Close(cctx, true)
		})
	}
	d.atExit(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := eng.Close(cctx); err != nil {
			lg.Error("stop engine", "err", err)
		}
	})
	return nil
}

// startSessions makes the session harness and its manager, and wakes the
// sessions that were working when the last daemon stopped.
func (d *upDaemon) startSessions(ctx context.Context, modelProviders map[string]session.Provider) error {
	m, eng, tlog := d.m, d.eng, d.tlog
	harness := &session.Harness{Log: tlog, Registry: d.reg, Meta: m, Boxes: session.EngineSandboxes{E: eng},
		Logger: d.lg.With("component", "sessions"), Holder: engine.LeaseHolder(eng.NodeID()), Failpoints: d.fps}
	if d.secrets != nil { // a nil *Store in the interface would not be nil
		harness.Secrets = d.secrets
	}
	harness.Providers = modelProviders            // the operator's; a tenant names no environment variable
	harness.EgressAllows = eng.TenantEgressAllows // a tenant's own model endpoint meets its egress allowlist
	if d.o.shared.shared() {
		// A session runs on the node that runs its sandbox; one without a
		// sandbox yet, or whose sandbox row is unreadable, is woken here
		// too (its stream lease decides who runs it).
		harness.Owns = func(ctx context.Context, se meta.Session) bool {
			if se.SandboxID == "" {
				return true
			}
			sb, err := m.Get(ctx, se.SandboxID)
			return err != nil || sb.Node == eng.NodeID()
		}
	}
	sessions := session.NewManager(harness)
	d.sessions = sessions
	if d.node != nil {
		d.node.SetSessions(sessions) // a takeover wakes the dead node's sessions here
	}
	eng.SetModelUsage(session.ModelUsage(tlog, m)) // model tokens in usage reports
	// Closed before the engine (undone last first).
	d.atExit(sessions.Close)
	// Sessions that were working when the last daemon stopped go on.
	if err := startRetry(ctx, d.lg, "wake sessions", sessions.Start); err != nil {
		return fmt.Errorf("wake sessions: %w", err)
	}
	return nil
}

// serve listens on --addr (TLS with --tls-cert), writes DATA_DIR/addr and
// serves the API until ctx ends.
func (d *upDaemon) serve(ctx context.Context) error {
	o, lg := d.o, d.lg
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another amber up running? pick another --addr)", o.addr, err)
	}
	scheme := "http://"
	if d.serveTLS != nil {
		ln, scheme = tls.NewListener(ln, d.serveTLS), "https://"
	}
	addrFile := filepath.Join(d.dataDir, "addr")
	if err := writeFileAtomic(addrFile, []byte(strings.TrimPrefix(scheme, "http://")+ln.Addr().String()+"\n"), 0o644); err != nil {
		return err
	}
	d.atExit(func() { os.Remove(addrFile) })
	sopts := server.Options{Engine: d.eng, Meta: d.m, Tenancy: engine.NewTenancy(d.m, nil), Audit: d.trail, Secrets: d.secrets, Metrics: d.mx, Tracer: d.tp, Logger: lg.With("component", "api"), Version: version, Sessions: d.sessions, Console: console.Assets()}
	if d.node != nil {
		sopts.Router = d.node
	}
	sopts.Hop = d.hop
	// E2B's in-sandbox API, for the e2b SDK (server/envd.go).
	sopts.Envd = true
	o.edge.apply(&sopts)
	api := server.New(sopts)
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		// Larger headers get net/http's 431 before any handler runs.
		MaxHeaderBytes: server.MaxHeaderBytes,
	}
	srv.RegisterOnShutdown(api.CloseStreams)
	lg.Info("amber is up", "addr", scheme+ln.Addr().String(), "driver", d.drv.Name(), "data_dir", d.dataDir,
		"templates", strings.Join(d.cat.Names(), ","), "admin_key", d.keyPath)
	return serve(ctx, srv, ln, lg)
}
