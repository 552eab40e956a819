// Package localfs is a blob.Store on a local filesystem: Amber's default
// place for checkpoint chunks and manifests.
//
// # Layout
//
// Under the root directory:
//
//	objects/<key>   one regular file per object; the key's segments are directories
//	tmp/            files being written; never visible as objects
//
// # Durability
//
// Put writes the bytes to a new file in tmp/, fsyncs it, renames it over
// objects/<key> and fsyncs the destination directory (and every directory it
// had to create, up to objects/), the sequence of containerd's atomicfile. A
// crash at any point leaves either the old object or the new one under the
// key; at worst an orphan temp file, which Open removes once it is older than
// an hour. PutIfAbsent links the fsynced temp file to the key (link(2) fails
// when the name exists), so exactly one of concurrent callers wins. Delete
// unlinks, fsyncs the directory and removes directories it left empty.
package localfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// staleTemp is the age after which Open removes a leftover temp file.
const staleTemp = time.Hour

// Store is a blob.Store rooted at a directory.
type Store struct {
	objects string
	tmp     string
}

var _ blob.Store = (*Store)(nil)

// Open creates (if needed) and opens the store rooted at dir.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("localfs %s: %w", dir, err)
	}
	s := &Store{objects: filepath.Join(abs, "objects"), tmp: filepath.Join(abs, "tmp")}
	for _, d := range []string{s.objects, s.tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("localfs %s: %w", dir, err)
		}
	}
	if err := syncDir(abs); err != nil {
		return nil, fmt.Errorf("localfs %s: %w", dir, err)
	}
	s.removeStaleTemps()
	return s, nil
}

func (s *Store) removeStaleTemps() {
	entries, err := os.ReadDir(s.tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			_ = os.Remove(filepath.Join(s.tmp, e.Name()))
		}
	}
}

func (s *Store) path(key string) string {
	return filepath.Join(s.objects, filepath.FromSlash(key))
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, false)
}

// PutIfAbsent implements blob.Store.
func (s *Store) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, true)
}

func (s *Store) put(ctx context.Context, key string, r io.Reader, size int64, exclusive bool) (err error) {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmp, err := s.writeTemp(ctx, key, r, size)
	if err != nil {
		return err
	}
	defer func() {
		// After a rename the temp name is gone; after a link or any
		// failure it must go.
		_ = os.Remove(tmp)
	}()
	dst := s.path(key)
	// A concurrent Delete may remove a parent directory between MkdirAll
	// and the rename; try again a few times.
	for attempt := 0; ; attempt++ {
		if err := s.mkdirAllSync(filepath.Dir(dst)); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
				return errdefs.Conflictf("put %s: a path prefix of the key is an object", key)
			}
			return s.mapErr("put", key, err)
		}
		if exclusive {
			err = os.Link(tmp, dst)
		} else {
			err = os.Rename(tmp, dst)
		}
		if err == nil {
			break
		}
		if exclusive && errors.Is(err, fs.ErrExist) {
			return errdefs.AlreadyExistsf("put %s", key)
		}
		if errors.Is(err, fs.ErrNotExist) && attempt < 5 {
			continue
		}
		return s.mapErr("put", key, err)
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return s.mapErr("put", key, err)
	}
	return nil
}

// writeTemp copies r into a new fsynced temp file and returns its path.
func (s *Store) writeTemp(ctx context.Context, key string, r io.Reader, size int64) (path string, err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := filepath.Join(s.tmp, "put-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", s.mapErr("put", key, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = s.mapErr("put", key, cerr)
		}
		if err != nil {
			_ = os.Remove(name)
		}
	}()
	src := r
	if size >= 0 {
		src = io.LimitReader(r, size)
	}
	n, err := io.Copy(f, ctxReader{ctx, src})
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("put %s: %w", key, ctx.Err())
		}
		return "", fmt.Errorf("put %s: after %d bytes: %w", key, n, err)
	}
	if size >= 0 {
		if n != size {
			return "", errdefs.InvalidArgumentf("put %s: reader gave %d bytes, want %d", key, n, size)
		}
		var one [1]byte
		if m, _ := io.ReadFull(r, one[:]); m > 0 {
			return "", errdefs.InvalidArgumentf("put %s: reader gave more than %d bytes", key, size)
		}
	}
	if err := f.Sync(); err != nil {
		return "", s.mapErr("put", key, err)
	}
	return name, nil
}

// mkdirAllSync creates dir and its missing parents below the objects root,
// fsyncing each parent after creating a child, so a created path survives a
// crash once the object's rename is durable.
func (s *Store) mkdirAllSync(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return syscall.ENOTDIR
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if dir != s.objects && parent != dir {
		if err := s.mkdirAllSync(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	f, err := os.Open(s.path(key))
	if err != nil {
		return nil, s.mapErr("get", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, s.mapErr("get", key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, errdefs.NotFoundf("get %s", key)
	}
	return f, nil
}

// GetRange implements blob.RangeGetter.
func (s *Store) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	f := rc.(*os.File)
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, n), f}, nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	fi, err := os.Stat(s.path(key))
	if err != nil {
		return blob.Info{}, s.mapErr("stat", key, err)
	}
	if !fi.Mode().IsRegular() {
		return blob.Info{}, errdefs.NotFoundf("stat %s", key)
	}
	return blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	p := s.path(key)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return s.mapErr("delete", key, err)
	}
	if fi.IsDir() {
		return nil // a "directory" of other keys is not an object
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s.mapErr("delete", key, err)
	}
	dir := filepath.Dir(p)
	if err := syncDir(dir); err != nil {
		return s.mapErr("delete", key, err)
	}
	// Remove directories the delete left empty; rmdir fails harmlessly on
	// a non-empty one (or one a concurrent Put just filled).
	for dir != s.objects {
		if os.Remove(dir) != nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	return nil
}

// List implements blob.Store. It walks the directory tree in key order
// (entries sorted with "/" appended to directory names), streaming.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if err := blob.ValidatePrefix(prefix); err != nil {
			yield(blob.Info{}, err)
			return
		}
		// Start at the deepest directory the prefix names in full.
		base := ""
		if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
			base = prefix[:i]
		}
		dir := s.objects
		if base != "" {
			dir = filepath.Join(s.objects, filepath.FromSlash(base))
		}
		_ = s.walk(ctx, dir, base, prefix, yield)
	}
}

// errStop ends a walk early.
var errStop = errors.New("stop")

func (s *Store) walk(ctx context.Context, dir, keyDir, prefix string, yield func(blob.Info, error) bool) error {
	if err := ctx.Err(); err != nil {
		yield(blob.Info{}, fmt.Errorf("list %s: %w", prefix, err))
		return errStop
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		yield(blob.Info{}, s.mapErr("list", prefix, err))
		return errStop
	}
	type ent struct {
		name, sortKey string
		dir           bool
	}
	ents := make([]ent, 0, len(entries))
	for _, e := range entries {
		key := e.Name()
		if keyDir != "" {
			key = keyDir + "/" + e.Name()
		}
		sk := key
		if e.IsDir() {
			sk += "/"
		}
		// Prune: the entry's keys all start with sk (dirs) or equal key.
		if !strings.HasPrefix(sk, prefix) && !strings.HasPrefix(prefix, sk) {
			continue
		}
		ents = append(ents, ent{name: key, sortKey: sk, dir: e.IsDir()})
	}
	slices.SortFunc(ents, func(a, b ent) int { return strings.Compare(a.sortKey, b.sortKey) })
	for _, e := range ents {
		p := filepath.Join(dir, filepath.Base(e.name))
		if e.dir {
			if err := s.walk(ctx, p, e.name, prefix, yield); err != nil {
				return err
			}
			continue
		}
		if !strings.HasPrefix(e.name, prefix) {
			continue
		}
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			yield(blob.Info{}, s.mapErr("list", prefix, err))
			return errStop
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		if !yield(blob.Info{Key: e.name, Size: fi.Size(), ModTime: fi.ModTime()}, nil) {
			return errStop
		}
	}
	return nil
}

// mapErr turns filesystem errors into error kinds.
func (s *Store) mapErr(op, key string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return errdefs.NotFoundf("%s %s", op, key)
	case errors.Is(err, syscall.EISDIR), errors.Is(err, fs.ErrExist):
		return errdefs.Conflictf("%s %s: key is a path prefix of another key (or the reverse): %v", op, key, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errdefs.ResourceExhaustedf("%s %s: %v", op, key, err)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
