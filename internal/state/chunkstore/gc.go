package chunkstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// marker is the content of a pending marker or of gc.lock.
type marker struct {
	Kind       string    `json:"kind"` // "writer" or "gc"
	Checkpoint string    `json:"checkpoint,omitempty"`
	Holder     string    `json:"holder"`
	Expires    time.Time `json:"expires"`
}

func holder() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", h, os.Getpid())
}

// holderDead reports whether holder (a marker's "host/pid") names a
// process of this host that no longer exists: a daemon killed while it
// collected. Its gc.lock is ignored at once instead of holding the
// tenant's writers until it expires. A holder of another host, one that
// does not parse, or a pid that is alive (or was reused) is not dead: the
// lock's expiry decides, as before.
func holderDead(holder string) bool {
	host, pidStr, ok := strings.Cut(holder, "/")
	me, _ := os.Hostname()
	if !ok || host == "" || host != me {
		return false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func (s *Store) putMarker(ctx context.Context, key string, m marker, exclusive bool) error {
	b, _ := json.Marshal(m)
	if exclusive {
		return s.cfg.Blobs.PutIfAbsent(ctx, key, strings.NewReader(string(b)), int64(len(b)))
	}
	return blob.PutBytes(ctx, s.cfg.Blobs, key, b)
}

// readMarker returns the marker under key; an unreadable one counts as live
// until PendingTTL after its modification time.
func (s *Store) readMarker(ctx context.Context, key string) (marker, error) {
	b, err := blob.ReadAll(ctx, s.cfg.Blobs, key, 64<<10)
	if err != nil {
		return marker{}, err
	}
	var m marker
	if json.Unmarshal(b, &m) != nil || m.Expires.IsZero() {
		info, err := s.cfg.Blobs.Stat(ctx, key)
		if err != nil {
			return marker{}, err
		}
		m = marker{Kind: "unreadable", Expires: info.ModTime.Add(s.cfg.PendingTTL)}
	}
	return m, nil
}

// writer is one Put's pending marker.
type writer struct {
	s       *Store
	key     string
	m       marker
	renewAt time.Time
}

// beginWrite writes the pending marker, then waits while a live collector
// holds gc.lock.
func (s *Store) beginWrite(ctx context.Context, tenant, id string) (*writer, error) {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	w := &writer{
		s:   s,
		key: pendingPrefix(tenant) + id + "." + hex.EncodeToString(nonce[:]),
		m:   marker{Kind: "writer", Checkpoint: id, Holder: holder()},
	}
	if err := w.write(ctx); err != nil {
		return nil, err
	}
	for {
		gm, err := s.readMarker(ctx, gcLockKey(tenant))
		if errdefs.IsNotFound(err) {
			return w, nil
		}
		if err != nil {
			w.end()
			return nil, fmt.Errorf("read %s: %w", gcLockKey(tenant), err)
		}
		if !s.cfg.Clock.Now().Before(gm.Expires) || holderDead(gm.Holder) {
			// A dead collector (its lock expired, or its process is
			// gone): its lock is ignored (the next collector replaces it).
			return w, nil
		}
		s.log.Debug("waiting for garbage collection", "tenant", tenant, "checkpoint", id, "collector", gm.Holder)
		select {
		case <-ctx.Done():
			w.end()
			return nil, fmt.Errorf("waiting for garbage collection of %s: %w", tenant, ctx.Err())
		case <-time.After(s.cfg.PollInterval):
		}
	}
}

func (w *writer) write(ctx context.Context) error {
	now := w.s.cfg.Clock.Now()
	w.m.Expires = now.Add(w.s.cfg.PendingTTL)
	if err := w.s.putMarker(ctx, w.key, w.m, false); err != nil {
		return fmt.Errorf("write pending marker: %w", err)
	}
	w.renewAt = now.Add(w.s.cfg.PendingTTL / 4)
	return nil
}

// alive fails with errdefs.ErrConflict when the marker is gone or about to
// expire: a collector may have judged this writer dead.
func (w *writer) alive(ctx context.Context) error {
	if !w.s.cfg.Clock.Now().Before(w.m.Expires.Add(-w.s.cfg.PendingTTL / 8)) {
		return errdefs.Conflictf("pending marker %s expired at %s: the writer stalled; a collector may have removed chunks it relies on",
			w.key, w.m.Expires.Format(time.RFC3339))
	}
	if _, err := w.s.cfg.Blobs.Stat(ctx, w.key); errdefs.IsNotFound(err) {
		return errdefs.Conflictf("pending marker %s was removed: a collector judged this writer dead", w.key)
	} else if err != nil {
		return fmt.Errorf("check pending marker: %w", err)
	}
	return nil
}

// renew extends the marker's expiry when a quarter of PendingTTL has passed.
func (w *writer) renew(ctx context.Context) error {
	if w.s.cfg.Clock.Now().Before(w.renewAt) {
		return nil
	}
	if err := w.alive(ctx); err != nil {
		return err
	}
	return w.write(ctx)
}

// confirm is the check right before publishing: the marker is still there
// and renewed, so no collector can judge this writer dead for PendingTTL.
func (w *writer) confirm(ctx context.Context) error {
	if err := w.alive(ctx); err != nil {
		return err
	}
	return w.write(ctx)
}

// end deletes the marker, even when ctx is done.
func (w *writer) end() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.s.cfg.Blobs.Delete(ctx, w.key); err != nil {
		w.s.log.Warn("could not delete pending marker; it blocks garbage collection until it expires",
			"key", w.key, "err", err)
	}
}

// GCResult tells what a collection did.
type GCResult struct {
	// Deferred is true when a live writer was in progress: nothing was
	// deleted; run GC again later.
	Deferred bool
	// Checkpoints is the number of committed checkpoints kept; Referenced
	// the number of distinct chunks they use.
	Checkpoints, Referenced int
	// Packs is the number of packs they use.
	Packs int
	// DeletedChunks and DeletedPacks count the chunk objects and the packs
	// removed, DeletedBytes the bytes of both.
	DeletedChunks, DeletedPacks int
	DeletedBytes                int64
	// DeletedManifests counts manifests of checkpoints never committed (or
	// deleted); StaleMarkers the expired pending markers removed.
	DeletedManifests, StaleMarkers int
}

// GC deletes the tenant's chunks and packs that no committed manifest
// references and its manifests that no pointer names. A pack goes when no
// chunk in it is referenced (packs are not rewritten). It is safe against concurrent Puts
// (see the package comment): while a live writer exists it deletes nothing
// and returns Deferred. A second concurrent GC of the same tenant fails with
// errdefs.ErrConflict. A committed manifest that cannot be read stops GC
// with its error before anything is deleted.
func (s *Store) GC(ctx context.Context, tenant string) (res GCResult, err error) {
	if err := validateID("tenant", tenant); err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("gc %s: %w", tenant, err)
		}
	}()
	lock, err := s.lockGC(ctx, tenant)
	if err != nil {
		return res, err
	}
	defer lock.release()
	if err := s.failAt("marked"); err != nil {
		return res, err
	}

	// Writers first: a live one may reference chunks no manifest names yet.
	now := s.cfg.Clock.Now()
	for info, err := range s.cfg.Blobs.List(ctx, pendingPrefix(tenant)) {
		if err != nil {
			return res, err
		}
		if err := lock.renew(ctx); err != nil {
			return res, err
		}
		m, err := s.readMarker(ctx, info.Key)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return res, err
		}
		if now.Before(m.Expires) {
			s.log.Info("garbage collection deferred: a checkpoint is being written", "tenant", tenant, "checkpoint", m.Checkpoint, "holder", m.Holder)
			res.Deferred = true
			return res, nil
		}
		s.log.Warn("removing expired pending marker", "key", info.Key, "holder", m.Holder, "expired", m.Expires)
		if err := s.cfg.Blobs.Delete(ctx, info.Key); err != nil {
			return res, err
		}
		res.StaleMarkers++
	}

	// What committed checkpoints reference.
	var ckptKeys []string
	for info, err := range s.cfg.Blobs.List(ctx, checkpointsPrefix(tenant)) {
		if err != nil {
			return res, err
		}
		if err := lock.renew(ctx); err != nil {
			return res, err
		}
		ckptKeys = append(ckptKeys, info.Key)
	}
	committed := map[string]string{} // id → manifest digest
	for _, k := range ckptKeys {
		id, name, _ := strings.Cut(strings.TrimPrefix(k, checkpointsPrefix(tenant)), "/")
		if name != pointerName {
			continue
		}
		p, err := s.readPointer(ctx, tenant, id)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return res, err
		}
		committed[id] = p.Manifest
	}
	keys, err := s.tenantKeys(tenant)
	if err != nil {
		return res, err
	}
	referenced := map[string]bool{} // chunks stored as their own object
	packs := map[string]bool{}
	for id, digest := range committed {
		if err := lock.renew(ctx); err != nil {
			return res, err
		}
		m, err := s.readManifest(ctx, tenant, id, digest)
		if err != nil {
			return res, err
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				if c.Pack != "" {
					packs[c.Pack] = true
					continue
				}
				sum, _ := hex.DecodeString(c.SHA256)
				referenced[keys.chunkName([32]byte(sum))] = true
			}
		}
	}
	res.Checkpoints, res.Referenced, res.Packs = len(committed), len(referenced), len(packs)
	if err := s.failAt("listed"); err != nil {
		return res, err
	}

	for _, k := range ckptKeys {
		id, name, _ := strings.Cut(strings.TrimPrefix(k, checkpointsPrefix(tenant)), "/")
		digest, ok := strings.CutPrefix(name, manifestPrefix)
		if !ok || committed[id] == digest {
			continue
		}
		if err := s.cfg.Blobs.Delete(ctx, k); err != nil {
			return res, err
		}
		res.DeletedManifests++
	}
	n, size, err := s.deleteUnreferenced(ctx, lock, chunksPrefix(tenant), func(key string) bool {
		name := chunkNameFromKey(tenant, key)
		return name != "" && referenced[name]
	})
	res.DeletedChunks, res.DeletedBytes = n, size
	if err != nil {
		return res, err
	}
	n, size, err = s.deleteUnreferenced(ctx, lock, packsPrefix(tenant), func(key string) bool {
		name := packNameFromKey(tenant, key)
		return name != "" && packs[name]
	})
	res.DeletedPacks, res.DeletedBytes = n, res.DeletedBytes+size
	if err != nil {
		return res, err
	}
	s.log.Info("garbage collected", "tenant", tenant, "checkpoints", res.Checkpoints,
		"deleted_chunks", res.DeletedChunks, "deleted_packs", res.DeletedPacks, "deleted_bytes", res.DeletedBytes, "deleted_manifests", res.DeletedManifests)
	return res, nil
}

// deleteUnreferenced deletes the objects under prefix that keep refuses,
// renewing the collector's lock as it goes.
func (s *Store) deleteUnreferenced(ctx context.Context, lock *gcLock, prefix string, keep func(key string) bool) (n int, size int64, err error) {
	for info, err := range s.cfg.Blobs.List(ctx, prefix) {
		if err != nil {
			return n, size, err
		}
		if err := lock.renew(ctx); err != nil {
			return n, size, err
		}
		if keep(info.Key) {
			continue
		}
		if err := s.cfg.Blobs.Delete(ctx, info.Key); err != nil {
			return n, size, err
		}
		n++
		size += info.Size
	}
	return n, size, nil
}

// gcLock is a held gc.lock.
type gcLock struct {
	s       *Store
	key     string
	m       marker
	renewAt time.Time
}

// lockGC takes gc.lock for tenant, replacing an expired one.
func (s *Store) lockGC(ctx context.Context, tenant string) (*gcLock, error) {
	now := s.cfg.Clock.Now()
	l := &gcLock{s: s, key: gcLockKey(tenant),
		m:       marker{Kind: "gc", Holder: holder(), Expires: now.Add(s.cfg.GCLockTTL)},
		renewAt: now.Add(s.cfg.GCLockTTL / 4)}
	for attempt := 0; ; attempt++ {
		err := s.putMarker(ctx, l.key, l.m, true)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, errdefs.ErrAlreadyExists) || attempt > 0 {
			return nil, fmt.Errorf("take %s: %w", l.key, err)
		}
		cur, rerr := s.readMarker(ctx, l.key)
		if rerr != nil && !errdefs.IsNotFound(rerr) {
			return nil, rerr
		}
		if rerr == nil && s.cfg.Clock.Now().Before(cur.Expires) && !holderDead(cur.Holder) {
			return nil, errdefs.Conflictf("a collection of %s is already running (%s)", tenant, cur.Holder)
		}
		if err := s.cfg.Blobs.Delete(ctx, l.key); err != nil {
			return nil, err
		}
	}
}

// renew extends the lock when a quarter of GCLockTTL has passed, so writers
// keep waiting for a long collection; a collector that stalled past its
// expiry stops (writers may be running). It is called at every step.
func (l *gcLock) renew(ctx context.Context) error {
	now := l.s.cfg.Clock.Now()
	if now.Before(l.renewAt) {
		return nil
	}
	if !now.Before(l.m.Expires.Add(-l.s.cfg.GCLockTTL / 8)) {
		return errdefs.Conflictf("%s expired while collecting: stopping (writers may be running)", l.key)
	}
	l.m.Expires = now.Add(l.s.cfg.GCLockTTL)
	l.renewAt = now.Add(l.s.cfg.GCLockTTL / 4)
	return l.s.putMarker(ctx, l.key, l.m, false)
}

func (l *gcLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.s.cfg.Blobs.Delete(ctx, l.key); err != nil {
		l.s.log.Warn("could not delete gc.lock; writers wait until it expires", "key", l.key, "err", err)
	}
}

// DeleteCheckpoint removes a committed checkpoint: its pointer first (it is
// invisible from then on), then its manifest, then collects the chunks only
// it referenced (see GC: with a writer in progress the collection is
// Deferred and the chunks go at a later GC). A checkpoint that is not
// committed is errdefs.ErrNotFound.
func (s *Store) DeleteCheckpoint(ctx context.Context, tenant, id string) (GCResult, error) {
	if err := validateID("tenant", tenant); err != nil {
		return GCResult{}, err
	}
	if err := validateID("checkpoint", id); err != nil {
		return GCResult{}, err
	}
	p, err := s.readPointer(ctx, tenant, id)
	if err != nil {
		return GCResult{}, err
	}
	if err := s.cfg.Blobs.Delete(ctx, pointerKey(tenant, id)); err != nil {
		return GCResult{}, fmt.Errorf("delete checkpoint %s/%s: %w", tenant, id, err)
	}
	if err := s.cfg.Blobs.Delete(ctx, manifestKey(tenant, id, p.Manifest)); err != nil {
		return GCResult{}, fmt.Errorf("delete checkpoint %s/%s: %w", tenant, id, err)
	}
	res, err := s.GC(ctx, tenant)
	if errdefs.IsConflict(err) {
		// Another collection is running; it may have read the references
		// before this delete, so the chunks go at a later one.
		return GCResult{Deferred: true}, nil
	}
	return res, err
}

// DeleteTenant removes every object of tenant: commit pointers first, then
// everything else; then it lists the tenant's prefix and fails with
// errdefs.ErrConflict if anything is left (a writer still at work). It
// returns the number of objects and bytes deleted.
func (s *Store) DeleteTenant(ctx context.Context, tenant string) (objects int, bytes int64, err error) {
	if err := validateID("tenant", tenant); err != nil {
		return 0, 0, err
	}
	for round := 0; round < 3; round++ {
		var pointers, rest []blob.Info
		for info, err := range s.cfg.Blobs.List(ctx, tenantPrefix(tenant)) {
			if err != nil {
				return objects, bytes, fmt.Errorf("delete tenant %s: %w", tenant, err)
			}
			if strings.HasSuffix(info.Key, "/"+pointerName) {
				pointers = append(pointers, info)
			} else {
				rest = append(rest, info)
			}
		}
		if len(pointers)+len(rest) == 0 {
			s.keys.Delete(tenant)
			return objects, bytes, nil
		}
		for _, info := range append(pointers, rest...) {
			if err := s.cfg.Blobs.Delete(ctx, info.Key); err != nil {
				return objects, bytes, fmt.Errorf("delete tenant %s: %w", tenant, err)
			}
			objects++
			bytes += info.Size
		}
	}
	var left []string
	for info, err := range s.cfg.Blobs.List(ctx, tenantPrefix(tenant)) {
		if err != nil {
			return objects, bytes, err
		}
		left = append(left, info.Key)
	}
	if len(left) > 0 {
		return objects, bytes, errdefs.Conflictf("delete tenant %s: %d objects reappeared (a writer is still active), e.g. %s", tenant, len(left), left[0])
	}
	return objects, bytes, nil
}
