package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/host/faults"
	"github.com/amber-run/amber/internal/host/fence"
	"github.com/amber-run/amber/internal/obs/logging"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

type upOptions struct {
	addr, driver, pool, logLevel, blobs string
	logFormat, otlpEndpoint             string
	watch                               time.Duration
	keep                                int
	idle                                time.Duration
	hotTier                             string // --hot-tier: size bound, or "off"
	lazyRestore                         bool   // --lazy-restore
	meterInterval                       time.Duration
	egress                              egressOptions
	shared                              sharedOptions
	takeOver                            bool
	models                              modelOptions
	edge                                edgeOptions // port domain, sandbox maxima, stream cap (up_limits.go)
	leaseTTL                            time.Duration
	auditKeyFile                        string // --audit-key-file (internal/state/audit: the chain's HMAC key)
	nodeTokenFile                       string // --node-token-file (httpx.Hop: node-to-node calls' credential)
	tlsCert, tlsKey, nodeCA             string // --tls-cert, --tls-key (serve HTTPS), --node-ca (forward over HTTPS)
}

func newUpCmd(g *globalFlags) *cobra.Command {
	o := &upOptions{}
	c := &cobra.Command{
		Use:   "up [--data-dir DIR] [--addr 127.0.0.1:7777] [--driver gvisor|criu] [--pool N]",
		Short: "Run the daemon in the foreground",
		Long: `Run the Amber daemon in the foreground until SIGINT or SIGTERM.

It never installs anything: it checks that the driver's runtime and the
templates are there and, when something is missing, names the command that
fixes it (make setup). On first start it writes an admin API key to
DATA_DIR/admin.key (mode 0600); clients on this machine read it from there.

--pool sets the warm pool: N sandboxes per template ("--pool 2"), or per
template ("--pool python=2,minimal=1"); 0 disables it. Pooled sandboxes are
destroyed when the daemon stops; after a crash, the ones still running are
reused.

--log-format json writes one JSON object per line; lines about an API
request carry request_id, tenant_id, sandbox_id (or checkpoint_id) and,
when traces are on, trace_id.

Traces (OpenTelemetry) of API requests and of create, exec, checkpoint and
restore are sent over OTLP/HTTP to --otlp-endpoint (a collector's base URL:
spans go to its /v1/traces), or where the standard OTEL_EXPORTER_OTLP_ENDPOINT
or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables say; with neither, no spans
are recorded.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error { return runUp(cmd, g, o) },
	}
	f := c.Flags()
	o.models.register(c)
	f.StringVar(&o.addr, "addr", defaultAddr, "address to listen on")
	f.StringVar(&o.driver, "driver", "gvisor", "sandbox driver: gvisor or criu")
	f.StringVar(&o.pool, "pool", "1", "warm sandboxes per template: N, or NAME=N,NAME=N")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "log lines as text (key=value) or json (one object per line)")
	f.StringVar(&o.otlpEndpoint, "otlp-endpoint", "", "send traces over OTLP/HTTP to this collector base URL, e.g. http://127.0.0.1:4318 (default: OTEL_EXPORTER_OTLP_ENDPOINT; none: no traces)")
	f.StringVar(&o.blobs, "blobs", "", "checkpoint blob store: a directory (default DATA_DIR/blobs) or s3://HOST:PORT/BUCKET[/PREFIX][?secure=false] with keys in AMBER_S3_ACCESS_KEY/AMBER_S3_SECRET_KEY")
	f.DurationVar(&o.meterInterval, "meter-interval", 10*time.Second, "usage metering interval: every running sandbox's usage is recorded per interval (negative: no metering)")
	f.StringVar(&o.hotTier, "hot-tier", "8Gi", "disk bound of the node's hot copies of each sandbox's newest checkpoint, from which a restore on this node starts without fetching (\"off\": every restore fetches)")
	f.BoolVar(&o.lazyRestore, "lazy-restore", true, "where the driver can (criu), a restore runs the sandbox before all its memory is loaded, the rest loaded in the background (false: every restore loads it all first)")
	f.DurationVar(&o.idle, "idle-timeout", 0, "checkpoint and stop a sandbox after this long without calls; the next call resumes it (0: never)")
	f.IntVar(&o.keep, "keep-checkpoints", 0, "keep each sandbox's newest N checkpoints plus tagged ones, delete the rest and truncate its log below them (0: keep all)")
	f.DurationVar(&o.watch, "watch-interval", 5*time.Second, "how often running sandboxes are checked for a dead init")
	f.BoolVar(&o.egress.enabled, "egress", true, "give sandboxes a way out through the egress gateway; off: loopback only")
	f.StringSliceVar(&o.egress.allow, "egress-allow", nil, "destinations (HOST:PORT patterns, *.suffix and * allowed) sandboxes may reach when their tenant set no egress policy (default: none)")
	f.StringSliceVar(&o.egress.ceiling, "egress-ceiling", nil, "the most any tenant's sandboxes may reach (HOST:PORT patterns): tenant and sandbox egress policies beyond it are refused (default: no ceiling)")
	f.StringSliceVar(&o.egress.caFiles, "egress-ca-file", nil, "PEM bundle of CAs the gateway trusts upstream besides the system's (repeatable)")
	f.BoolVar(&o.egress.journal, "egress-journal", true, "journal every outbound request (off only as a test's negative control)")
	_ = f.MarkHidden("egress-journal")
	o.shared.register(f)
	o.edge.register(f)
	f.StringVar(&o.auditKeyFile, "audit-key-file", os.Getenv("AMBER_AUDIT_KEY_FILE"), "the audit chain's HMAC key (hex, mode 0600), the same file on every node (default $AMBER_AUDIT_KEY_FILE; without: DATA_DIR/audit.key, created on first start, or with --store derived from --master-key-file)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve the API over HTTPS with this PEM certificate (with --tls-key; clients then use https://, trusting its CA: SSL_CERT_FILE)")
	f.StringVar(&o.tlsKey, "tls-key", "", "the PEM private key of --tls-cert (mode 0600)")
	f.StringVar(&o.nodeCA, "node-ca", "", "with --store: forward calls to the other nodes over HTTPS, verifying their --tls-cert against this PEM CA")
	f.StringVar(&o.nodeTokenFile, "node-token-file", os.Getenv("AMBER_NODE_TOKEN_FILE"), "with --store: the secret (mode 0600) every node and API server of the deployment shares; calls they forward to each other carry it and a call marked forwarded without it is refused (default $AMBER_NODE_TOKEN_FILE; none: forwarded calls are not authenticated)")
	f.BoolVar(&o.takeOver, "take-over", false, "take the data dir over from a daemon that still holds its lock but stopped renewing its lease (paused, hung): wait for the lease to expire, then fence it")
	f.DurationVar(&o.leaseTTL, "lease-ttl", 15*time.Second, "time to live of the daemon's lease on its data dir (renewed every quarter of it); a paused daemon is fenced this long after its last renewal")
	f.StringSliceVar(&o.egress.hosts, "egress-host", nil, "NAME=IP names the gateway resolves itself (local services, tests); reachable by that name even on a private address")
	return c
}

func cacheDir() string { return firstNonEmpty(os.Getenv("AMBER_CACHE"), "/var/cache/amber") }

// parsePool reads "N" (every template) or "name=N,name=N".
func parsePool(s string, names []string) (map[string]int, error) {
	out := map[string]int{}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > 64 {
			return nil, usageError{fmt.Errorf("--pool %d is out of range 0..64", n)}
		}
		for _, name := range names {
			out[name] = n
		}
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 || n > 64 {
			return nil, usageError{fmt.Errorf("--pool %q: want N or NAME=N,NAME=N with N in 0..64", s)}
		}
		out[name] = n
	}
	return out, nil
}

// newLogger is the daemon's and the API server's logger from their
// --log-format and --log-level flags (a bad value is a usage error).
func newLogger(cmd *cobra.Command, format, levelName string) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: %v", levelName, err)}
	}
	lg, err := logging.New(cmd.ErrOrStderr(), format, level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-format: %v", err)}
	}
	return lg, nil
}

// runUp is amber up: the logger, the tracer, then the steps of up_wire.go
// in order, and the API served until a signal.
func runUp(cmd *cobra.Command, g *globalFlags, o *upOptions) error {
	lg, err := newLogger(cmd, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if err := o.edge.check(o.addr); err != nil {
		return err
	}
	modelProviders, err := o.models.parse()
	if err != nil {
		return err
	}
	tp, err := tracing.Setup(cmd.Context(), tracing.Config{Endpoint: o.otlpEndpoint, Version: version})
	if err != nil {
		return usageError{err}
	}
	// Flushed last, after the engine stopped: its final spans go too.
	defer func() {
		// Send the buffered spans; a collector that is gone may not hold
		// up the exit for long.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			lg.Warn("flush traces", "endpoint", tp.Endpoint, "err", err)
		}
	}()
	if tp.Enabled() {
		lg.Info("sending traces over OTLP/HTTP", "endpoint", tp.Endpoint)
	}
	d := &upDaemon{g: g, o: o, lg: lg, tp: tp}
	// Undone before the traces are flushed, last first (up_wire.go).
	defer d.close()
	if err := d.lockDataDir(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	d.atExit(stop)
	for _, step := range []func(context.Context) error{
		d.openDriver,      // the driver and the egress network, checked before any state is touched
		d.openMeta,        // metadata, the admin key, the node's name
		d.openLog,         // the event log, behind the data-dir lease (or the node lease)
		d.openCheckpoints, // checkpoints, blobs, templates, the warm pool
		func(context.Context) error { return d.openObservers() },
		d.startGateway,
		d.startEngine,
		func(ctx context.Context) error { return d.startSessions(ctx, modelProviders) },
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return d.serve(ctx)
}

// openCheckpointStore opens the chunk store of checkpoints on the blob
// store named by blobs (see openBlobs) with the data dir's master key, and
// the failpoints fps (tests: blob.* in front of the blob store, chunkstore.*
// between a Put's steps; nil in production), and
// empties the work directory where images are cut and fetched (cleanWorkDir).
func openCheckpointStore(ctx context.Context, dataDir, blobs, keyFile string, fps *failpoint.Set, lg *slog.Logger) (*chunkstore.Store, blob.Store, string, error) {
	bs, where, err := openBlobs(ctx, dataDir, blobs, lg)
	if err != nil {
		return nil, nil, "", err
	}
	bs = faults.Blobs(bs, fps)
	var failAt func(string) error
	if fps != nil {
		failAt = func(step string) error { return fps.Eval("chunkstore." + step) }
	}
	key, err := loadMasterKey(dataDir, keyFile, chunkstore.MasterKeySize)
	if err != nil {
		return nil, nil, "", err
	}
	cs, err := chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: key, FailAt: failAt, Logger: lg.With("component", "chunkstore", "blobs", where)})
	if err != nil {
		return nil, nil, "", err
	}
	work := filepath.Join(dataDir, "work")
	if err := cleanWorkDir(work, lg); err != nil {
		return nil, nil, "", err
	}
	return cs, bs, work, nil
}

// cleanWorkDir empties work, where images are cut and fetched, of what a
// crashed daemon left there (cut-*, fetch-*, hot-* link trees: garbage),
// and keeps the hot tier (engine.HotTierDir): its copies are the only
// image of a strict checkpoint committed on the node whose upload is
// pending, and the source of a restart's hot restores; the tier itself
// removes a copy a crash left incomplete.
//
// Garbage that will not go is no reason not to start: a helper the killed
// daemon started (a criu dump) may still be writing into its cut
// directory. It is logged and removed again in the background, every 2 s
// for a minute; the names of new cuts and fetches never collide with it.
func cleanWorkDir(work string, lg *slog.Logger) error {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(work)
	if err != nil {
		return fmt.Errorf("clean work dir: %w", err)
	}
	var left []string
	for _, e := range ents {
		if e.Name() == engine.HotTierDir && e.IsDir() {
			continue
		}
		p := filepath.Join(work, e.Name())
		if err := os.RemoveAll(p); err != nil {
			lg.Warn("work dir: could not remove what a previous daemon left; trying again in the background", "path", p, "err", err)
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		go func() {
			for i := 0; i < 30 && len(left) > 0; i++ {
				time.Sleep(2 * time.Second)
				left = slices.DeleteFunc(left, func(p string) bool { return os.RemoveAll(p) == nil })
			}
			if len(left) > 0 {
				lg.Warn("work dir: left behind; the next start removes it", "paths", left)
			}
		}()
	}
	return nil
}

// exitFenced is amber up's exit status when it finds its data dir taken
// over (EX_TEMPFAIL).
const exitFenced = 75

// sweepLeases bumps the lease epoch of every stream a previous daemon of
// this data dir may hold (sessions, sandboxes, their effect journals), so
// that its writes in flight are refused by the log (fence.Sweep).
func sweepLeases(ctx context.Context, log eventlog.Store, m metadata.Store, holder string) (int, error) {
	var streams []string
	ss, err := m.ListSessions(ctx, "")
	if err != nil {
		return 0, err
	}
	for _, s := range ss {
		streams = append(streams, session.Stream(s.ID))
	}
	sbs, err := m.List(ctx, meta.Filter{})
	if err != nil {
		return 0, err
	}
	for _, sb := range sbs {
		streams = append(streams, engine.Stream(sb.ID), gateway.Stream(sb.ID))
	}
	return fence.Sweep(ctx, log, holder, streams)
}

// lockDataDir makes sure one daemon at a time uses dataDir.
func lockDataDir(dataDir string) (func(), error) {
	path := filepath.Join(dataDir, "daemon.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("another amber up (pid %s) uses data dir %s", strings.TrimSpace(string(b)), dataDir)
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { f.Close() }, nil
}
