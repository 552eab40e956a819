package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// unit is one read of a restore: jobs[first:first+n], in manifest order.
// Either a run of chunks stored back to back in one pack (one ranged read
// of size bytes from off), or one chunk stored as its own object, or a
// repeat of a chunk an earlier unit reads (served from the cache, or read
// again alone once the cache is full).
type unit struct {
	first, n  int
	pack      string
	off, size int64
	repeat    bool
}

// planUnits groups jobs into reads: consecutive chunks that lie back to
// back in the same pack become one read of at most maxRead bytes.
func planUnits(jobs []job) []unit {
	var units []unit
	seen := make(map[string]bool, len(jobs))
	for i, j := range jobs {
		c := j.entry.Chunks[j.index]
		if seen[j.name] {
			units = append(units, unit{first: i, n: 1, repeat: true})
			continue
		}
		seen[j.name] = true
		if c.Pack != "" && len(units) > 0 {
			u := &units[len(units)-1]
			if !u.repeat && u.pack == c.Pack && u.off+u.size == c.Offset && u.size+c.Sealed <= maxRead {
				u.n++
				u.size += c.Sealed
				continue
			}
		}
		units = append(units, unit{first: i, n: 1, pack: c.Pack, off: c.Offset, size: c.Sealed})
	}
	return units
}

// reserve makes a cache entry for each chunk u reads first that is
// referenced again later, while the cache has room. Called in unit order
// before u's read starts.
func (r *restorer) reserve(u unit) {
	if u.repeat {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs[u.first : u.first+u.n] {
		if r.refs[j.name] > 1 && r.cache[j.name] == nil && r.cacheSz+MaxChunk <= repeatCache {
			r.cache[j.name] = &cached{ready: make(chan struct{})}
			r.cacheSz += MaxChunk
		}
	}
}

// fetchUnit returns the verified plaintexts of u's chunks.
func (r *restorer) fetchUnit(ctx context.Context, u unit) (out [][]byte, err error) {
	jobs := r.jobs[u.first : u.first+u.n]
	if u.repeat {
		j := jobs[0]
		r.mu.Lock()
		c := r.cache[j.name]
		r.mu.Unlock()
		if c != nil {
			select {
			case <-c.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if c.err == nil {
				return [][]byte{c.data}, nil
			}
		}
		data, err := r.loadOne(ctx, j)
		return [][]byte{data}, err
	}
	defer func() {
		// Whatever happens, the repeats waiting for these chunks wake.
		for i, j := range jobs {
			var data []byte
			if err == nil {
				data = out[i]
			}
			r.fill(j.name, data, err)
		}
	}()
	if u.pack == "" {
		data, err := r.loadOne(ctx, jobs[0])
		return [][]byte{data}, err
	}
	key := packKey(r.m.Tenant, u.pack)
	obj, err := blob.ReadRange(ctx, r.s.cfg.Blobs, key, u.off, u.size)
	if err != nil {
		return nil, r.readErr(jobs[0], key, err)
	}
	r.fetched.Add(1)
	out = make([][]byte, len(jobs))
	for i, j := range jobs {
		c := j.entry.Chunks[j.index]
		at := c.Offset - u.off
		if out[i], err = r.open(j, obj[at:at+c.Sealed:at+c.Sealed]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fill hands a chunk read first to the repeats waiting in the cache.
func (r *restorer) fill(name string, data []byte, err error) {
	r.mu.Lock()
	c := r.cache[name]
	r.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case <-c.ready: // already filled
	default:
		// A copy: a raw chunk's plaintext shares its read's buffer (up to
		// maxRead), which the cache must not keep alive.
		c.data, c.err = bytes.Clone(data), err
		close(c.ready)
	}
}

// release notes that one reference to name was written.
func (r *restorer) release(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refs[name]--
	if r.refs[name] <= 0 {
		if _, ok := r.cache[name]; ok {
			delete(r.cache, name)
			r.cacheSz -= MaxChunk
		}
	}
}

// loadOne reads one chunk alone: its own object, or its bytes in its pack.
func (r *restorer) loadOne(ctx context.Context, j job) ([]byte, error) {
	ref := j.entry.Chunks[j.index]
	var obj []byte
	var err error
	key := chunkKey(r.m.Tenant, j.name)
	if ref.Pack != "" {
		key = packKey(r.m.Tenant, ref.Pack)
		obj, err = blob.ReadRange(ctx, r.s.cfg.Blobs, key, ref.Offset, ref.Sealed)
	} else {
		obj, err = blob.ReadAllSized(ctx, r.s.cfg.Blobs, key, MaxChunk+SealOverhead+1024, ref.Size+SealOverhead)
	}
	if err != nil {
		return nil, r.readErr(j, key, err)
	}
	r.fetched.Add(1)
	return r.open(j, obj)
}

func (r *restorer) readErr(j job, key string, err error) error {
	switch {
	case errdefs.IsNotFound(err):
		return errdefs.DataLossf("%s: %s is missing", r.where(j), key)
	case errdefs.IsDataLoss(err):
		return errdefs.DataLossf("%s: %v", r.where(j), err)
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return errdefs.DataLossf("%s: stored object is too large", r.where(j))
	}
	return fmt.Errorf("%s: %w", r.where(j), err)
}

// open decrypts and checks one sealed chunk against the manifest.
//
// AES-GCM under the tenant's key, with the chunk's own key (its name, the
// SHA-256 of its plaintext) in the authenticated data, proves the bytes
// are the ones Amber sealed for that name: a tampered, swapped, truncated
// or misplaced chunk fails there. Verify also hashes the plaintext again
// (a check of Amber's own writer); a Restore does not: that SHA-256 was a
// quarter of a cold restore's CPU on this machine (~0.2 s at 256 MiB).
func (r *restorer) open(j job, obj []byte) ([]byte, error) {
	ref := j.entry.Chunks[j.index]
	// The sealed chunk names the chunk's own key, wherever it is stored.
	key := chunkKey(r.m.Tenant, j.name)
	// The manifest gives the chunk's size: the plaintext's buffer is made
	// that size (chunks average far less than MaxChunk), and a chunk that
	// would decompress to more is damaged anyway.
	plain, err := r.keys.open(kindChunk, key, obj, int(min(ref.Size, MaxChunk)))
	if err != nil {
		return nil, errdefs.DataLossf("%s: %v", r.where(j), err)
	}
	if int64(len(plain)) != ref.Size {
		return nil, errdefs.DataLossf("%s: content is %d bytes", r.where(j), len(plain))
	}
	if r.root == "" {
		if sum := sha256.Sum256(plain); hex.EncodeToString(sum[:]) != ref.SHA256 {
			return nil, errdefs.DataLossf("%s: content has sha256 %x", r.where(j), sum)
		}
	}
	return plain, nil
}
