package chunkstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/stores/localfs"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

// backend names a blob store to run scenarios against.
type backend struct {
	name string
	open func(t *testing.T) blob.Store
	// packSize is the stores' Config.PackSize (0: the default, packs).
	packSize int
}

func localBackend() backend {
	return backend{name: "localfs", open: func(t *testing.T) blob.Store {
		s, err := localfs.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}}
}

// perChunk stores every chunk as its own object (format 1's layout).
func perChunk(b backend) backend {
	b.name += "-per-chunk"
	b.packSize = -1
	return b
}

// smallPacks closes packs at 256 KiB (when the store packs at all), so that
// a test's few MiB make many packs.
func smallPacks(c *chunkstore.Config) {
	if c.PackSize >= 0 {
		c.PackSize = 256 << 10
	}
}

// minioBackend starts one MinIO for the calling test; each open is a new
// bucket on it.
func minioBackend(t *testing.T) backend {
	srv := miniotest.Start(t)
	return backend{name: "minio", open: func(t *testing.T) blob.Store { return srv.Store(t) }}
}

// env is a chunkstore over a (faulty-wrapped) backend with a fake clock.
type env struct {
	t      *testing.T
	blobs  blob.Store // the real store
	faulty *blobtest.Faulty
	clock  *clock.Fake
	store  *chunkstore.Store
	cfg    chunkstore.Config
}

var masterKey = bytes.Repeat([]byte{0x42}, chunkstore.MasterKeySize)

func newEnv(t *testing.T, b backend, mod ...func(*chunkstore.Config)) *env {
	blobs := b.open(t)
	e := &env{t: t, blobs: blobs, faulty: blobtest.NewFaulty(blobs, nil),
		clock: clock.NewFake(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}
	e.cfg = chunkstore.Config{Blobs: e.faulty, MasterKey: masterKey, Clock: e.clock, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), PackSize: b.packSize}
	for _, m := range mod {
		m(&e.cfg)
	}
	e.store = e.reopen(nil)
	return e
}

// reopen returns a new Store on the same blobs (a fresh process), with
// failAt installed.
func (e *env) reopen(failAt func(string) error) *chunkstore.Store {
	cfg := e.cfg
	cfg.FailAt = failAt
	s, err := chunkstore.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// keys lists the real store under prefix.
func (e *env) keys(prefix string) []string {
	var out []string
	for info, err := range e.blobs.List(context.Background(), prefix) {
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, info.Key)
	}
	return out
}

// storedBytes sums the sizes of the objects under prefix.
func (e *env) storedBytes(prefix string) int64 {
	var n int64
	for info, err := range e.blobs.List(context.Background(), prefix) {
		if err != nil {
			e.t.Fatal(err)
		}
		n += info.Size
	}
	return n
}

// dataKeys lists the objects that hold the tenant's chunks: chunk objects
// and packs.
func (e *env) dataKeys(tenant string) []string {
	return append(e.keys("tenants/"+tenant+"/chunks/"), e.keys("tenants/"+tenant+"/packs/")...)
}

// packed tells whether the store writes packs.
func (e *env) packed() bool { return e.cfg.PackSize >= 0 }

// isDataPut matches the writes of chunk objects and packs.
func isDataPut(op blobtest.Op, key string) bool {
	return op == blobtest.OpPut && (strings.Contains(key, "/chunks/") || strings.Contains(key, "/packs/"))
}

func (e *env) put(tenant, id, src string, opts chunkstore.PutOptions) chunkstore.PutResult {
	e.t.Helper()
	res, err := e.store.Put(ctx(e.t), tenant, id, src, opts)
	if err != nil {
		e.t.Fatalf("put %s/%s: %v", tenant, id, err)
	}
	return res
}

// restoreEqual restores (tenant, id) and checks it equals want.
func (e *env) restoreEqual(s *chunkstore.Store, tenant, id, want string) chunkstore.RestoreResult {
	e.t.Helper()
	dst := filepath.Join(e.t.TempDir(), "restored")
	res, err := s.Restore(ctx(e.t), tenant, id, dst, chunkstore.RestoreOptions{})
	if err != nil {
		e.t.Fatalf("restore %s/%s: %v", tenant, id, err)
	}
	treeEqual(e.t, want, dst)
	return res
}

// writeRandom writes size pseudo-random bytes (seeded) to path.
func writeRandom(t *testing.T, path string, seed uint64, size int) []byte {
	t.Helper()
	b := randBytes(seed, size)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func randBytes(seed uint64, size int) []byte {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, size)
	_, _ = rand.NewChaCha8(s).Read(b)
	return b
}

// sampleTree builds a small image: dirs, a symlink, an empty file, a
// setuid file, a zero-filled file, random data.
func sampleTree(t *testing.T, seed uint64) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "image")
	writeRandom(t, filepath.Join(root, "pages-1.img"), seed, 3<<20+12345)
	writeRandom(t, filepath.Join(root, "sub", "deeper", "core-7.img"), seed+1, 200<<10)
	must(t, os.WriteFile(filepath.Join(root, "sub", "empty"), nil, 0o600))
	must(t, os.WriteFile(filepath.Join(root, "zeros.img"), make([]byte, 2<<20), 0o640))
	must(t, os.WriteFile(filepath.Join(root, "suid"), []byte("#!/bin/true\n"), 0o755))
	must(t, os.Chmod(filepath.Join(root, "suid"), 0o755|fs.ModeSetuid))
	must(t, os.Symlink("pages-1.img", filepath.Join(root, "link")))
	must(t, os.Symlink("/etc/does-not-matter", filepath.Join(root, "sub", "abs-link")))
	must(t, os.Mkdir(filepath.Join(root, "emptydir"), 0o711))
	return root
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// treeEqual compares two trees: types, modes, contents, link targets.
func treeEqual(t *testing.T, want, got string) {
	t.Helper()
	a, b := describe(t, want), describe(t, got)
	if !slices.Equal(a, b) {
		t.Fatalf("restored tree differs:\nwant %q\n got %q", a, b)
	}
}

func describe(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := rel + " " + info.Mode().String()
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			line += " " + hex.EncodeToString(sum[:8])
		}
		if rel == "." {
			line = ". dir" // the root's own mode is the caller's
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// corrupt flips one byte in the middle of the stored object key.
func (e *env) corrupt(key string) { e.corruptAt(key, -1) }

// corruptAt flips a bit of the object's byte at off (-1: its middle).
func (e *env) corruptAt(key string, off int64) {
	e.t.Helper()
	b, err := blob.ReadAll(context.Background(), e.blobs, key, 1<<30)
	if err != nil {
		e.t.Fatal(err)
	}
	if off < 0 {
		off = int64(len(b) / 2)
	}
	b[off] ^= 0x01
	if err := blob.PutBytes(context.Background(), e.blobs, key, b); err != nil {
		e.t.Fatal(err)
	}
}

func hasPrefix(keys []string, prefix string) []string {
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}
