package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/restic/chunker"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// Progress reports a long transfer: Done of Total bytes of file content.
type Progress struct {
	Done, Total int64
}

// CommitFunc is the caller's say in making a checkpoint visible. Put calls it
// once the chunks and the manifest are durable, with the manifest's digest.
// It must call publish exactly once to write the commit pointer, and return
// its error; a CommitFunc that refuses (say, the writer's lease epoch is
// stale: errdefs.ErrFenced) returns an error without calling publish, and
// the checkpoint never becomes visible. The intended shape:
//
//	func(ctx context.Context, digest string, publish func(context.Context) error) error {
//		// check (and hold) the writer's lease epoch in the event log
//		if err := publish(ctx); err != nil {
//			return err
//		}
//		// append the checkpoint event (CheckpointRef) under the same epoch
//	}
//
// If it returns an error after publish succeeded, the checkpoint stays
// committed in storage (PutResult.Published is true) and the caller decides
// what to do with it (typically DeleteCheckpoint once it knows the log does
// not reference it).
type CommitFunc func(ctx context.Context, manifestDigest string, publish func(context.Context) error) error

// PutOptions are the optional parts of Put.
type PutOptions struct {
	// Parent names an earlier committed checkpoint of the same tenant
	// (usually the previous one of the sandbox): the chunks its manifest
	// lists are known to be stored, so Put does not look them up. A parent
	// that no longer exists is ignored; a damaged one fails the Put.
	Parent string
	// Meta is recorded in the manifest.
	Meta map[string]string
	// Commit, when set, decides whether and when the pointer is written.
	Commit CommitFunc
	// Progress, when set, is called as chunks become durable. It must be
	// quick; it is called from one goroutine at a time.
	Progress func(Progress)
	// Unchanged, when set, names the files (by image path) that are, when
	// they have the size the parent's file of the same path has, byte for
	// byte that file: Put takes their chunks and digest from the parent's
	// manifest without reading them. It is for files whose name stands for
	// content that never changes (a layer blob: a cache file never written
	// once made, named by a random key); a wrong answer stores a manifest
	// that does not describe the file.
	Unchanged func(path string) bool
}

// PutResult tells what a Put stored.
type PutResult struct {
	Info
	// Published is true once the commit pointer is written.
	Published   bool
	ImageDigest string
	Files       int
	// Size is the total size of the files; Chunks their chunk count.
	Size   int64
	Chunks int
	// NewChunks were written by this Put (the others were already stored).
	NewChunks int
	// ReusedFiles were described from the parent's manifest without being
	// read (PutOptions.Unchanged).
	ReusedFiles int
	// StoredBytes is the size of every object this Put wrote: new chunks,
	// the manifest, the pointer.
	StoredBytes int64
	Duration    time.Duration
}

// Put stores the directory tree src as checkpoint id of tenant and commits
// it (see the package comment for the order of writes). It fails with
// errdefs.ErrAlreadyExists if id is already committed, errdefs.ErrConflict
// if the writer's pending marker was lost (a collector judged it dead), and
// with whatever opts.Commit returns. src holds regular files, directories and
// symlinks only (errdefs.ErrInvalidArgument otherwise) and must not change
// while Put reads it.
//
// A Put that fails before publishing leaves no visible trace: the objects it
// wrote are unreferenced and the collector removes them. Put may be retried
// with the same id.
func (s *Store) Put(ctx context.Context, tenant, id, src string, opts PutOptions) (res PutResult, err error) {
	start := time.Now()
	if err := validateID("tenant", tenant); err != nil {
		return res, err
	}
	if err := validateID("checkpoint", id); err != nil {
		return res, err
	}
	defer func() {
		res.Duration = time.Since(start)
		if err != nil {
			err = fmt.Errorf("put checkpoint %s/%s: %w", tenant, id, err)
		}
	}()
	keys, err := s.tenantKeys(tenant)
	if err != nil {
		return res, err
	}
	if _, err := s.readPointer(ctx, tenant, id); err == nil {
		return res, errdefs.AlreadyExistsf("checkpoint %s/%s is already committed", tenant, id)
	} else if !errdefs.IsNotFound(err) {
		return res, err
	}
	entries, total, err := scanTree(src)
	if err != nil {
		return res, err
	}

	w, err := s.beginWrite(ctx, tenant, id)
	if err != nil {
		return res, err
	}
	defer w.end()

	known, parentFiles, err := s.parentChunks(ctx, keys, tenant, id, opts.Parent)
	if err != nil {
		return res, err
	}

	// 2. Chunks: all durable before the manifest is written.
	up := s.newUploader(ctx, keys, tenant, known, total, opts.Progress)
	for i := range entries {
		e := &entries[i]
		if e.Type != TypeFile {
			continue
		}
		if pe, ok := parentFiles[e.Path]; ok && opts.Unchanged != nil && pe.Size == e.Size && opts.Unchanged(e.Path) {
			// Known content: the parent's chunks, which the pending
			// marker keeps from collection like every known chunk.
			e.SHA256, e.Chunks = pe.SHA256, slices.Clone(pe.Chunks)
			res.ReusedFiles++
			up.report(e.Size)
			continue
		}
		if err := up.file(filepath.Join(src, filepath.FromSlash(e.Path)), e, w); err != nil {
			up.abort(err)
			break
		}
	}
	if err := up.wait(); err != nil {
		return res, err
	}
	up.place(entries, known)
	res.NewChunks, res.StoredBytes = int(up.newChunks.Load()), up.stored.Load()
	if err := s.failAt("chunks"); err != nil {
		return res, err
	}

	// 3. Manifest.
	m := &Manifest{
		FormatVersion: FormatVersion,
		Tenant:        tenant,
		Checkpoint:    id,
		CreatedAt:     s.cfg.Clock.Now().UTC(),
		Meta:          opts.Meta,
		Chunker:       chunkerName,
		Entries:       entries,
		Size:          total,
		ImageDigest:   imageDigest(entries),
	}
	for _, e := range entries {
		if e.Type == TypeFile {
			res.Files++
			res.Chunks += len(e.Chunks)
		}
	}
	res.Size, res.ImageDigest = total, m.ImageDigest
	plain, digest, err := m.encode()
	if err != nil {
		return res, err
	}
	mkey := manifestKey(tenant, id, digest)
	sealed := keys.seal(nil, kindManifest, mkey, plain, nil)
	if err := blob.PutBytes(ctx, s.cfg.Blobs, mkey, sealed); err != nil {
		return res, fmt.Errorf("write manifest: %w", err)
	}
	res.StoredBytes += int64(len(sealed))
	res.ManifestDigest = digest
	if err := s.failAt("manifest"); err != nil {
		return res, err
	}

	// 4–5. Commit hook and pointer.
	if err := w.confirm(ctx); err != nil {
		return res, err
	}
	var publishCalls int
	publish := func(ctx context.Context) error {
		publishCalls++
		if publishCalls > 1 {
			return errdefs.FailedPreconditionf("publish called twice")
		}
		if err := s.failAt("publish"); err != nil {
			return err
		}
		p := pointer{FormatVersion: pointerVersion, Checkpoint: id, Manifest: digest, CommittedAt: s.cfg.Clock.Now().UTC()}
		b, _ := json.Marshal(p)
		err := s.cfg.Blobs.PutIfAbsent(ctx, pointerKey(tenant, id), bytes.NewReader(b), int64(len(b)))
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			if cur, rerr := s.readPointer(ctx, tenant, id); rerr == nil && cur.Manifest == digest {
				err = nil // our own earlier attempt
				p = cur
			} else {
				return errdefs.AlreadyExistsf("checkpoint %s/%s was committed by another writer", tenant, id)
			}
		}
		if err != nil {
			return fmt.Errorf("write pointer: %w", err)
		}
		res.Published, res.CommittedAt = true, p.CommittedAt
		res.StoredBytes += int64(len(b))
		return nil
	}
	if opts.Commit != nil {
		err = opts.Commit(ctx, digest, publish)
		if err == nil && !res.Published {
			err = errdefs.FailedPreconditionf("commit hook returned without publishing")
		}
	} else {
		err = publish(ctx)
	}
	if err != nil {
		return res, err
	}
	res.ID = id
	if err := s.failAt("committed"); err != nil {
		return res, err
	}
	return res, nil
}

// parentChunks returns the chunks of checkpoint id's parent by name, with
// where each is stored, and its files by path (none without a parent, or
// when the parent is gone: that only costs lookups, or new copies in
// packs). Put reads them after the pending marker is written: from then on
// no collector removes the parent's chunks, even if the parent is deleted
// meanwhile.
func (s *Store) parentChunks(ctx context.Context, keys *tenantKeys, tenant, id, parent string) (map[string]ChunkRef, map[string]*Entry, error) {
	known, files := map[string]ChunkRef{}, map[string]*Entry{}
	if parent == "" {
		return known, files, nil
	}
	pm, err := s.Manifest(ctx, tenant, parent)
	if errdefs.IsNotFound(err) {
		s.log.Info("parent checkpoint is gone; looking chunks up instead", "tenant", tenant, "checkpoint", id, "parent", parent)
		pm = &Manifest{}
	} else if err != nil {
		return nil, nil, fmt.Errorf("parent %s: %w", parent, err)
	}
	for i, e := range pm.Entries {
		if e.Type == TypeFile {
			files[e.Path] = &pm.Entries[i]
		}
		for _, c := range e.Chunks {
			sum, _ := hex.DecodeString(c.SHA256)
			known[keys.chunkName([32]byte(sum))] = c
		}
	}
	return known, files, nil
}

// scanTree lists src: directories, symlinks and regular files, parents
// before children.
func scanTree(src string) ([]Entry, int64, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, 0, errdefs.InvalidArgumentf("source %s: %v", src, err)
	}
	if !fi.IsDir() {
		return nil, 0, errdefs.InvalidArgumentf("source %s: not a directory", src)
	}
	var entries []Entry
	var total int64
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == src {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Path: filepath.ToSlash(rel), Mode: unixPerm(info.Mode())}
		switch {
		case info.IsDir():
			e.Type = TypeDir
		case info.Mode()&fs.ModeSymlink != 0:
			e.Type = TypeSymlink
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
			e.Mode = 0
		case info.Mode().IsRegular():
			e.Type = TypeFile
			e.Size = info.Size()
			total += e.Size
		default:
			return errdefs.InvalidArgumentf("%s: unsupported file type %v", p, info.Mode().Type())
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return nil, 0, err
		}
		return nil, 0, fmt.Errorf("scan %s: %w", src, err)
	}
	return entries, total, nil
}

func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return p
}

func fileMode(p uint32) fs.FileMode {
	m := fs.FileMode(p & 0o777)
	if p&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if p&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if p&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// uploader writes the chunks of one Put with Concurrency workers. Chunking
// and hashing happen on the caller's goroutine; sealing and writing in the
// workers.
type uploader struct {
	s        *Store
	keys     *tenantKeys
	tenant   string
	ctx      context.Context
	cancel   context.CancelCauseFunc
	jobs     chan upJob
	wg       sync.WaitGroup
	queued   map[string]bool // names known stored or queued by this Put
	seq      int64           // the next job's number (file's goroutine)
	pk       *packer         // nil: every chunk its own object
	bufs     sync.Pool
	progress func(Progress)
	progMu   sync.Mutex
	total    int64
	done     int64 // under progMu

	newChunks atomic.Int64
	stored    atomic.Int64
}

type upJob struct {
	seq  int64
	name string
	data *[]byte
}

func (s *Store) newUploader(ctx context.Context, keys *tenantKeys, tenant string, known map[string]ChunkRef, total int64, progress func(Progress)) *uploader {
	ctx, cancel := context.WithCancelCause(ctx)
	u := &uploader{
		s: s, keys: keys, tenant: tenant, ctx: ctx, cancel: cancel,
		jobs:     make(chan upJob, s.cfg.Concurrency),
		queued:   make(map[string]bool, len(known)),
		progress: progress,
		total:    total,
	}
	for name := range known {
		u.queued[name] = true
	}
	if s.cfg.PackSize > 0 {
		u.pk = newPacker(u, s.cfg.PackSize)
	}
	u.bufs.New = func() any { b := make([]byte, 0, MaxChunk); return &b }
	for range s.cfg.Concurrency {
		u.wg.Go(u.worker)
	}
	u.report(0)
	return u
}

func (u *uploader) report(n int64) {
	if u.progress == nil {
		return
	}
	// Count and report under one lock, so reports never go backwards.
	u.progMu.Lock()
	defer u.progMu.Unlock()
	u.done += n
	u.progress(Progress{Done: u.done, Total: u.total})
}

func (u *uploader) abort(err error) { u.cancel(err) }

// wait waits for the workers, writes the last pack, and returns the first
// error.
func (u *uploader) wait() error {
	close(u.jobs)
	u.wg.Wait()
	if err := context.Cause(u.ctx); err != nil {
		return err
	}
	if u.pk != nil {
		if err := u.pk.flush(); err != nil {
			u.cancel(err)
			return err
		}
	}
	u.cancel(nil)
	return nil
}

// file chunks one file, fills e.SHA256, e.Size and e.Chunks, and queues the
// chunks not stored yet. Two stages run at once: one goroutine finds chunk
// boundaries (Rabin fingerprints) and copies each chunk out; this one hashes
// the chunks and the whole file, in order, and queues the new ones.
func (u *uploader) file(path string, e *Entry, w *writer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", e.Path, err)
	}
	defer f.Close()
	pieces := make(chan *[]byte, 8)
	readErr := make(chan error, 1)
	go func() {
		defer close(pieces)
		ch := chunker.NewWithBoundaries(bufio.NewReaderSize(f, 1<<20), u.keys.pol, MinChunk, MaxChunk)
		ch.SetAverageBits(AvgBits)
		buf := make([]byte, MaxChunk)
		for {
			c, err := ch.Next(buf)
			if err == io.EOF {
				readErr <- nil
				return
			}
			if err != nil {
				readErr <- err
				return
			}
			b := u.bufs.Get().(*[]byte)
			*b = append((*b)[:0], c.Data...)
			select {
			case pieces <- b:
			case <-u.ctx.Done():
				u.bufs.Put(b)
				readErr <- context.Cause(u.ctx)
				return
			}
		}
	}()
	fh := sha256.New()
	var size int64
	var stop error
	e.Chunks = e.Chunks[:0]
	for b := range pieces {
		if stop != nil {
			u.bufs.Put(b) // drain until the reader sees the cancellation
			continue
		}
		data := *b
		sum := sha256.Sum256(data)
		fh.Write(data)
		size += int64(len(data))
		e.Chunks = append(e.Chunks, ChunkRef{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))})
		name := u.keys.chunkName(sum)
		if u.queued[name] {
			u.report(int64(len(data)))
			u.bufs.Put(b)
		} else {
			u.queued[name] = true
			select {
			case u.jobs <- upJob{seq: u.seq, name: name, data: b}:
				u.seq++
			case <-u.ctx.Done():
				u.bufs.Put(b)
				stop = context.Cause(u.ctx)
			}
		}
		if stop == nil {
			stop = w.renew(u.ctx)
		}
		if stop != nil {
			u.abort(stop)
		}
	}
	if err := <-readErr; err != nil && stop == nil {
		return fmt.Errorf("read %s: %w", e.Path, err)
	}
	if stop != nil {
		return stop
	}
	e.Size = size
	e.SHA256 = hex.EncodeToString(fh.Sum(nil))
	return nil
}

func (u *uploader) worker() {
	var sealed, scratch []byte
	for j := range u.jobs {
		if u.ctx.Err() != nil {
			u.bufs.Put(j.data)
			continue
		}
		n := int64(len(*j.data))
		var err error
		if u.pk != nil {
			sealed = u.keys.seal(sealed[:0], kindChunk, chunkKey(u.tenant, j.name), *j.data, &scratch)
			if err = u.pk.add(j.seq, j.name, sealed); err == nil {
				u.newChunks.Add(1)
			}
		} else {
			err = u.store(j.name, *j.data, &sealed, &scratch)
		}
		if err != nil {
			u.cancel(err)
		} else {
			u.report(n)
		}
		u.bufs.Put(j.data)
	}
}

// store writes one chunk unless it is already stored.
func (u *uploader) store(name string, data []byte, sealed, scratch *[]byte) error {
	key := chunkKey(u.tenant, name)
	if _, err := u.s.cfg.Blobs.Stat(u.ctx, key); err == nil {
		return nil
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("look up chunk %s: %w", key, err)
	}
	*sealed = u.keys.seal((*sealed)[:0], kindChunk, key, data, scratch)
	if err := blob.PutBytes(u.ctx, u.s.cfg.Blobs, key, *sealed); err != nil {
		return fmt.Errorf("write chunk %s: %w", key, err)
	}
	u.newChunks.Add(1)
	u.stored.Add(int64(len(*sealed)))
	return nil
}
