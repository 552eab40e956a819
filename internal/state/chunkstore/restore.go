package chunkstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// RestoreOptions are the optional parts of Restore.
type RestoreOptions struct {
	// Progress, when set, is called as file content is written (verified).
	Progress func(Progress)
}

// RestoreResult tells what a Restore read.
type RestoreResult struct {
	Manifest *Manifest
	Files    int
	// Size is the bytes of file content restored; Chunks the chunk
	// references; Fetched the chunk objects read from the store (repeated
	// chunks, e.g. runs of zero pages, are fetched once while they fit a
	// 64 MiB cache).
	Size            int64
	Chunks, Fetched int
	Duration        time.Duration
}

// repeatCache bounds the memory that holds chunks referenced more than once.
const repeatCache = 64 << 20

// Restore writes checkpoint id of tenant into dst, which must not exist.
// Every chunk is authenticated (AES-GCM under its name) and checked against
// the manifest's size, then the whole-image digest; a missing or damaged object is
// errdefs.ErrDataLoss naming the file and chunk. The tree is built in a
// temporary directory beside dst and renamed to dst only once all of it
// verified, so a failed Restore leaves nothing at dst. Files are not
// fsynced: a restore interrupted by a crash is simply run again.
func (s *Store) Restore(ctx context.Context, tenant, id, dst string, opts RestoreOptions) (RestoreResult, error) {
	if dst == "" {
		return RestoreResult{}, errdefs.InvalidArgumentf("restore %s/%s: no destination", tenant, id)
	}
	return s.restore(ctx, tenant, id, dst, opts)
}

// Verify reads and checks checkpoint id of tenant as Restore does, writing
// nothing.
func (s *Store) Verify(ctx context.Context, tenant, id string, opts RestoreOptions) (RestoreResult, error) {
	return s.restore(ctx, tenant, id, "", opts)
}

func (s *Store) restore(ctx context.Context, tenant, id, dst string, opts RestoreOptions) (res RestoreResult, err error) {
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	m, err := s.Manifest(ctx, tenant, id)
	if err != nil {
		return res, err
	}
	res.Manifest = m
	keys, err := s.tenantKeys(tenant)
	if err != nil {
		return res, err
	}
	tmp := ""
	if dst != "" {
		if _, err := os.Lstat(dst); err == nil {
			return res, errdefs.AlreadyExistsf("restore %s/%s: %s exists", tenant, id, dst)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return res, fmt.Errorf("restore %s/%s: %w", tenant, id, err)
		}
		tmp, err = os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".restore-")
		if err != nil {
			return res, fmt.Errorf("restore %s/%s: %w", tenant, id, err)
		}
		defer func() {
			if err != nil {
				_ = os.RemoveAll(tmp)
			}
		}()
	}
	r := &restorer{s: s, keys: keys, m: m, root: tmp, progress: opts.Progress}
	if err := r.run(ctx); err != nil {
		if errdefs.IsDataLoss(err) {
			// A checkpoint deleted while it was being read is gone, not
			// damaged.
			if _, perr := s.readPointer(ctx, tenant, id); errdefs.IsNotFound(perr) {
				return res, errdefs.NotFoundf("checkpoint %s/%s was deleted during the restore (%v)", tenant, id, err)
			}
		}
		return res, err
	}
	res.Files, res.Size, res.Chunks, res.Fetched = r.files, m.Size, r.chunks, int(r.fetched.Load())
	if dst != "" {
		if err := os.Rename(tmp, dst); err != nil {
			return res, fmt.Errorf("restore %s/%s: %w", tenant, id, err)
		}
	}
	return res, nil
}

type restorer struct {
	s        *Store
	keys     *tenantKeys
	m        *Manifest
	root     string // "" verifies only
	progress func(Progress)

	jobs          []job
	files, chunks int
	done          int64
	fetched       atomic.Int64
	observed      []Entry // entries with the digests the content had

	mu      sync.Mutex
	refs    map[string]int // chunk name → references not yet written
	cache   map[string]*cached
	cacheSz int64
}

type cached struct {
	ready chan struct{}
	data  []byte
	err   error
}

// job is one chunk reference, in manifest order.
type job struct {
	entry  *Entry
	index  int
	offset int64
	name   string
}

type fetched struct {
	data [][]byte // a unit's chunks' plaintexts
	err  error
}

func (r *restorer) where(j job) string {
	c := j.entry.Chunks[j.index]
	at := "object " + chunkKey(r.m.Tenant, j.name)
	if c.Pack != "" {
		at = fmt.Sprintf("%d bytes at %d of pack %s", c.Sealed, c.Offset, packKey(r.m.Tenant, c.Pack))
	}
	return fmt.Sprintf("checkpoint %s/%s: file %q: chunk #%d at offset %d (sha256 %s, %s)",
		r.m.Tenant, r.m.Checkpoint, j.entry.Path, j.index, j.offset, c.SHA256, at)
}

func (r *restorer) run(ctx context.Context) error {
	// Fetchers stop (cancel) before they are waited for (wg.Wait).
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var jobs []job
	r.refs = map[string]int{}
	r.cache = map[string]*cached{}
	for i := range r.m.Entries {
		e := &r.m.Entries[i]
		var off int64
		for ci, c := range e.Chunks {
			sum, _ := hex.DecodeString(c.SHA256)
			name := r.keys.chunkName([32]byte(sum))
			jobs = append(jobs, job{entry: e, index: ci, offset: off, name: name})
			r.refs[name]++
			off += c.Size
		}
	}
	r.jobs = jobs
	units := planUnits(jobs)
	// Fetch ahead with Concurrency reads in flight; consume in order. A
	// slot is freed only when its unit is consumed, which bounds memory.
	results := make([]chan fetched, len(units))
	for i := range results {
		results[i] = make(chan fetched, 1)
	}
	slots := make(chan struct{}, r.s.cfg.Concurrency)
	wg.Go(func() {
		for i, u := range units {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			// Reserved here, in manifest order, so that every later
			// repeat of a chunk finds its entry and waits for this read.
			r.reserve(u)
			wg.Go(func() {
				data, err := r.fetchUnit(ctx, u)
				results[i] <- fetched{data, err}
			})
		}
	})
	next, ui := 0, 0
	var cur [][]byte
	take := func() (job, []byte, error) {
		j := jobs[next]
		if cur == nil {
			var f fetched
			select {
			case f = <-results[ui]:
			case <-ctx.Done():
				return j, nil, ctx.Err()
			}
			if f.err != nil {
				return j, nil, f.err
			}
			cur = f.data
		}
		data := cur[next-units[ui].first]
		next++
		if next == units[ui].first+len(cur) {
			cur = nil
			ui++
			<-slots
		}
		r.release(j.name)
		return j, data, nil
	}
	total := r.m.Size
	r.report(total)
	var dirs []*Entry
	r.observed = make([]Entry, len(r.m.Entries))
	for i := range r.m.Entries {
		e := &r.m.Entries[i]
		r.observed[i] = *e
		p := r.path(e)
		switch e.Type {
		case TypeDir:
			if p != "" {
				if err := os.Mkdir(p, 0o700); err != nil {
					return fmt.Errorf("restore %q: %w", e.Path, err)
				}
			}
			dirs = append(dirs, e)
		case TypeSymlink:
			if p != "" {
				if err := os.Symlink(e.Target, p); err != nil {
					return fmt.Errorf("restore %q: %w", e.Path, err)
				}
			}
		case TypeFile:
			r.files++
			sum, err := r.file(e, p, take, total)
			if err != nil {
				return err
			}
			r.observed[i].SHA256 = sum
		}
	}
	// Directory modes last (a read-only directory would refuse its files).
	for i := len(dirs) - 1; i >= 0 && r.root != ""; i-- {
		if err := os.Chmod(r.path(dirs[i]), fileMode(dirs[i].Mode)); err != nil {
			return fmt.Errorf("restore %q: %w", dirs[i].Path, err)
		}
	}
	if got := imageDigest(r.observed); got != r.m.ImageDigest {
		return errdefs.DataLossf("checkpoint %s/%s: image digest %s, manifest says %s", r.m.Tenant, r.m.Checkpoint, got, r.m.ImageDigest)
	}
	return nil
}

func (r *restorer) path(e *Entry) string {
	if r.root == "" {
		return ""
	}
	return filepath.Join(r.root, filepath.FromSlash(e.Path))
}

func (r *restorer) report(total int64) {
	if r.progress != nil {
		r.progress(Progress{Done: r.done, Total: total})
	}
}

// file writes one file from its chunks, skipping (leaving sparse) chunks of
// zeros. Verify also hashes each chunk and the whole file again; Restore
// does not: AES-GCM proved each chunk sealed under its name (open), its
// size is the manifest's, the chunk sizes add up to the file's
// (Manifest.check), and the file is exactly those chunks in order — each
// SHA-256 pass over 256 MiB cost ~0.2 s of a cold restore's CPU on this
// machine, for no check the seal had not made.
func (r *restorer) file(e *Entry, p string, take func() (job, []byte, error), total int64) (string, error) {
	var f *os.File
	if p != "" {
		var err error
		f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return "", fmt.Errorf("restore %q: %w", e.Path, err)
		}
		defer f.Close()
	}
	var h hash.Hash
	if f == nil {
		h = sha256.New()
	}
	for range e.Chunks {
		j, data, err := take()
		if err != nil {
			return "", err
		}
		r.chunks++
		if h != nil {
			h.Write(data)
		}
		if f != nil && !isZero(data) {
			if _, err := f.WriteAt(data, j.offset); err != nil {
				return "", fmt.Errorf("restore %q: %w", e.Path, err)
			}
		}
		r.done += int64(len(data))
		r.report(total)
	}
	if f == nil {
		got := hex.EncodeToString(h.Sum(nil))
		if got != e.SHA256 {
			return "", errdefs.DataLossf("checkpoint %s/%s: file %q: content sha256 %s, manifest says %s",
				r.m.Tenant, r.m.Checkpoint, e.Path, got, e.SHA256)
		}
		return got, nil
	}
	got := e.SHA256
	if err := f.Truncate(e.Size); err != nil {
		return "", fmt.Errorf("restore %q: %w", e.Path, err)
	}
	if err := f.Chmod(fileMode(e.Mode)); err != nil {
		return "", fmt.Errorf("restore %q: %w", e.Path, err)
	}
	return got, f.Close()
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
