package chunkstore

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
)

// Chunking parameters. The average chunk is about MinChunk + 2^AvgBits
// bytes (~190 KiB). Measured on 64 MiB of random data with 100 KiB changed in
// the middle (20 trials): these store 316 KiB on average, 665 KiB at worst;
// 512 KiB–8 MiB chunks (restic's defaults) store 2.1 MiB on average. The
// target is 1.5 × changed + 1 MiB.
const (
	MinChunk = 64 << 10
	AvgBits  = 17
	MaxChunk = 512 << 10
)

var chunkerName = fmt.Sprintf("rabin-tenant-pol/min=%d/avgbits=%d/max=%d", MinChunk, AvgBits, MaxChunk)

// maxManifest bounds a manifest's plaintext (a 1 GiB image needs ~600 KiB).
const maxManifest = 256 << 20

// Config configures a Store.
type Config struct {
	// Blobs is where everything is stored.
	Blobs blob.Store
	// MasterKey (MasterKeySize bytes) derives every tenant's keys. Losing it
	// loses every checkpoint; changing it orphans them.
	MasterKey []byte
	// Clock judges marker expiry (default: the wall clock).
	Clock clock.Clock
	// Concurrency is the number of chunk transfers in flight (default 8).
	Concurrency int
	// PackSize is the size at which Put closes a pack of new chunks
	// (default DefaultPackSize; see pack.go). Negative: every chunk its own
	// object, as format 1 stored them (kept for tests of old checkpoints).
	PackSize int
	// PendingTTL is how long a writer's marker stays live without
	// renewal (default one hour); see the package comment.
	PendingTTL time.Duration
	// GCLockTTL is how long a collector's gc.lock stays live without
	// renewal (default 30 s; renewed at every step of a collection). It
	// bounds how long writers wait after a collector died: they wait for
	// gc.lock, so with an hour a crash during GC stopped the tenant's
	// checkpoints for an hour (found by the chaos harness).
	GCLockTTL time.Duration
	// PollInterval is how often a writer waiting for a collector looks
	// again (default 200 ms).
	PollInterval time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// FailAt, when set, is called at each named step of Put ("chunks",
	// "manifest", "publish", "committed") and of GC ("marked", "listed");
	// an error it returns aborts the operation there, as a crash would.
	// For tests.
	FailAt func(step string) error
}

// Store keeps checkpoints of many tenants on one blob.Store. It is safe for
// concurrent use.
type Store struct {
	cfg  Config
	log  *slog.Logger
	keys sync.Map // tenant → *tenantKeys
}

// New returns a Store.
func New(cfg Config) (*Store, error) {
	if cfg.Blobs == nil {
		return nil, errdefs.InvalidArgumentf("chunkstore: no blob store")
	}
	if len(cfg.MasterKey) != MasterKeySize {
		return nil, errdefs.InvalidArgumentf("chunkstore: master key must be %d bytes", MasterKeySize)
	}
	cfg.MasterKey = append([]byte(nil), cfg.MasterKey...)
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.PackSize == 0 {
		cfg.PackSize = DefaultPackSize
	}
	if cfg.PendingTTL <= 0 {
		cfg.PendingTTL = time.Hour
	}
	if cfg.GCLockTTL <= 0 {
		cfg.GCLockTTL = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Store{cfg: cfg, log: log.With("component", "chunkstore")}, nil
}

func (s *Store) failAt(step string) error {
	if s.cfg.FailAt == nil {
		return nil
	}
	if err := s.cfg.FailAt(step); err != nil {
		return fmt.Errorf("at step %q: %w", step, err)
	}
	return nil
}

func (s *Store) tenantKeys(tenant string) (*tenantKeys, error) {
	if k, ok := s.keys.Load(tenant); ok {
		return k.(*tenantKeys), nil
	}
	k, err := deriveTenantKeys(s.cfg.MasterKey, tenant)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: derive keys: %w", tenant, err)
	}
	actual, _ := s.keys.LoadOrStore(tenant, k)
	return actual.(*tenantKeys), nil
}

// Info describes a committed checkpoint.
type Info struct {
	ID             string
	ManifestDigest string
	CommittedAt    time.Time
}

// readPointer returns the committed pointer of (tenant, id):
// errdefs.ErrNotFound when it is not committed.
func (s *Store) readPointer(ctx context.Context, tenant, id string) (pointer, error) {
	b, err := blob.ReadAll(ctx, s.cfg.Blobs, pointerKey(tenant, id), 64<<10)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return pointer{}, errdefs.NotFoundf("checkpoint %s/%s", tenant, id)
		}
		return pointer{}, fmt.Errorf("checkpoint %s/%s: read pointer: %w", tenant, id, err)
	}
	var p pointer
	if err := json.Unmarshal(b, &p); err != nil || p.Checkpoint != id || !isHex64(p.Manifest) {
		return pointer{}, errdefs.DataLossf("checkpoint %s/%s: pointer %s is malformed", tenant, id, pointerKey(tenant, id))
	}
	return p, nil
}

// Stat returns a committed checkpoint's Info, errdefs.ErrNotFound if
// there is none.
func (s *Store) Stat(ctx context.Context, tenant, id string) (Info, error) {
	if err := validateID("tenant", tenant); err != nil {
		return Info{}, err
	}
	if err := validateID("checkpoint", id); err != nil {
		return Info{}, err
	}
	p, err := s.readPointer(ctx, tenant, id)
	if err != nil {
		return Info{}, err
	}
	return Info{ID: id, ManifestDigest: p.Manifest, CommittedAt: p.CommittedAt}, nil
}

// Manifest reads and verifies a committed checkpoint's manifest.
func (s *Store) Manifest(ctx context.Context, tenant, id string) (*Manifest, error) {
	if err := validateID("tenant", tenant); err != nil {
		return nil, err
	}
	if err := validateID("checkpoint", id); err != nil {
		return nil, err
	}
	p, err := s.readPointer(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return s.readManifest(ctx, tenant, id, p.Manifest)
}

func (s *Store) readManifest(ctx context.Context, tenant, id, digest string) (*Manifest, error) {
	keys, err := s.tenantKeys(tenant)
	if err != nil {
		return nil, err
	}
	key := manifestKey(tenant, id, digest)
	obj, err := blob.ReadAll(ctx, s.cfg.Blobs, key, maxManifest+SealOverhead)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, errdefs.DataLossf("checkpoint %s/%s: manifest %s is missing (committed pointer names it)", tenant, id, key)
		}
		return nil, fmt.Errorf("checkpoint %s/%s: read manifest: %w", tenant, id, err)
	}
	plain, err := keys.open(kindManifest, key, obj, maxManifest)
	if err != nil {
		return nil, errdefs.DataLossf("checkpoint %s/%s: manifest %s: %v", tenant, id, key, err)
	}
	return decodeManifest(plain, tenant, id, digest, MaxChunk)
}

// List returns the tenant's committed checkpoints, by id.
func (s *Store) List(ctx context.Context, tenant string) ([]Info, error) {
	if err := validateID("tenant", tenant); err != nil {
		return nil, err
	}
	var out []Info
	for info, err := range s.cfg.Blobs.List(ctx, checkpointsPrefix(tenant)) {
		if err != nil {
			return nil, fmt.Errorf("list checkpoints of %s: %w", tenant, err)
		}
		rest := strings.TrimPrefix(info.Key, checkpointsPrefix(tenant))
		id, name, ok := strings.Cut(rest, "/")
		if !ok || name != pointerName {
			continue
		}
		p, err := s.readPointer(ctx, tenant, id)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, Info{ID: id, ManifestDigest: p.Manifest, CommittedAt: p.CommittedAt})
	}
	return out, nil
}
