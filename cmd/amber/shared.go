package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/cluster"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/postgres"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// sharedOptions are the flags of a node of a deployment on shared stores
// (docs/deploy.md).
type sharedOptions struct {
	store         string // postgres://… (event log, metadata, leases); "": SQLite in the data dir
	nodeID        string
	advertise     string
	masterKeyFile string
	ttl           time.Duration
	heartbeat     time.Duration
	maxSandboxes  int // 0: no limit
}

func (o *sharedOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.store, "store", "", "event log and metadata: empty for SQLite in DATA_DIR, or postgres://USER@HOST:PORT/DB?… shared by every node (default $AMBER_STORE; the password is best given as PGPASSWORD or in ~/.pgpass)")
	f.StringVar(&o.nodeID, "node-id", "", "this node's id in a deployment on shared stores (default: the host name); unique per node")
	f.StringVar(&o.advertise, "advertise-addr", "", "host:port where the other nodes reach this node's API (default: --addr)")
	f.StringVar(&o.masterKeyFile, "master-key-file", "", "the checkpoint and secrets master key (hex), the same file on every node (required with --store postgres://; default without: DATA_DIR/master.key, created on first start)")
	f.DurationVar(&o.ttl, "node-ttl", cluster.DefaultTTL, "node lease: a node silent this long is declared dead and its sandboxes are restored elsewhere")
	f.DurationVar(&o.heartbeat, "heartbeat", 0, "how often the node lease is renewed (default: --node-ttl / 8)")
	f.IntVar(&o.maxSandboxes, "node-max-sandboxes", 0, "sandboxes this node runs at most (0: no limit); a create arriving at a full node goes to another node with room")
}

// resolve fills the defaults and checks the combination.
func (o *sharedOptions) resolve(listen string) error {
	if o.store == "" {
		o.store = os.Getenv("AMBER_STORE")
	}
	if o.store == "" {
		return nil
	}
	if !sqlmeta.IsPostgres(o.store) {
		return usageError{fmt.Errorf("--store %q: want postgres://… (or nothing, for SQLite in the data dir)", redactStore(o.store))}
	}
	if o.masterKeyFile == "" {
		return usageError{fmt.Errorf("--store postgres://… needs --master-key-file: every node must read the others' checkpoints and secrets with the same key (make one with: head -c 32 /dev/urandom | xxd -p -c 64 > master.key; chmod 600 master.key)")}
	}
	if o.nodeID == "" {
		o.nodeID, _ = os.Hostname()
	}
	if o.nodeID == "" || len(o.nodeID) > 128 || strings.ContainsAny(o.nodeID, " /\t\n") {
		return usageError{fmt.Errorf("--node-id %q: 1..128 characters without spaces or slashes", o.nodeID)}
	}
	if o.advertise == "" {
		o.advertise = listen
	}
	if host, port, err := net.SplitHostPort(o.advertise); err != nil || port == "0" || host == "" || host == "0.0.0.0" || host == "::" {
		return usageError{fmt.Errorf("--advertise-addr %q: the other nodes need a host:port that reaches this node (set --advertise-addr when --addr listens on all interfaces or on port 0)", o.advertise)}
	}
	if o.maxSandboxes < 0 {
		return usageError{fmt.Errorf("--node-max-sandboxes %d: want 0 (no limit) or more", o.maxSandboxes)}
	}
	if o.ttl <= 0 || (o.heartbeat != 0 && (o.heartbeat < 0 || o.heartbeat >= o.ttl)) {
		return usageError{fmt.Errorf("--node-ttl %s / --heartbeat %s: want 0 < heartbeat < node-ttl", o.ttl, o.heartbeat)}
	}
	return nil
}

func (o *sharedOptions) shared() bool { return o.store != "" }

// cgroupParent is the cgroup parent of this node's sandboxes: the
// driver's default alone, or /amber/DRIVER-NODE on shared stores (a
// sandbox keeps its id when it moves, so two nodes on one machine would
// otherwise share, and tear down, each other's cgroups).
func (o *sharedOptions) cgroupParent(driver string) string {
	if !o.shared() {
		return ""
	}
	return "/amber/" + driver + "-" + o.nodeID
}

// metaSpec is where the metadata store lives.
func (o *sharedOptions) metaSpec(dataDir string) string {
	if o.shared() {
		return o.store
	}
	return dataDir + "/meta.db"
}

// openSharedLog opens the event log on PostgreSQL.
func openSharedLog(ctx context.Context, dsn string, lg *slog.Logger) (*postgres.Store, error) {
	s, err := postgres.Open(ctx, dsn, postgres.Options{Logger: lg.With("component", "eventlog")})
	if err != nil {
		return nil, fmt.Errorf("event log on %s: %w", redactStore(dsn), err)
	}
	return s, nil
}

// loadMasterKey returns the master key: from keyFile when given (it must
// exist: a node never invents the key the others use), else from
// DATA_DIR/master.key (created on first start).
func loadMasterKey(dataDir, keyFile string, size int) ([]byte, error) {
	if keyFile == "" {
		return ensureMasterKey(dataDir, size)
	}
	b, err := readKeyFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--master-key-file: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != size {
		return nil, fmt.Errorf("--master-key-file %s does not hold a %d-byte hex key", keyFile, size)
	}
	return key, nil
}

// nodeCapacity reports what this node runs, for its heartbeat.
func nodeCapacity(m metadata.Sandboxes, eng *engine.Engine, templates []string, maxSandboxes int) func(context.Context) meta.NodeCapacity {
	mem := cluster.HostMemory()
	return func(ctx context.Context) meta.NodeCapacity {
		c := meta.NodeCapacity{MemoryBytes: mem, MaxSandboxes: maxSandboxes, Templates: templates, Driver: eng.Driver().Name()}
		id := eng.NodeID()
		rows, err := m.List(ctx, meta.Filter{Node: &id, States: []meta.State{meta.StateRunning}})
		if err == nil {
			for _, sb := range rows {
				c.Sandboxes++
				c.UsedMemoryBytes += sb.Limits.MemoryBytes
			}
		}
		return c
	}
}

// redactStore drops a password from a postgres:// address for messages.
func redactStore(s string) string {
	if at := strings.LastIndex(s, "@"); at > 0 {
		if i := strings.Index(s, "://"); i > 0 && i < at {
			user, _, _ := strings.Cut(s[i+3:at], ":")
			return s[:i+3] + user + "@" + s[at+1:]
		}
	}
	return s
}

var _ eventlog.Store = (*postgres.Store)(nil)
