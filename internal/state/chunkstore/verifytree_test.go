package chunkstore_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/chunkstore"
)

// TestVerifyTree: a copy of an image kept beside the store matches its
// manifest; a changed byte (same size), a missing file or an extra one is
// data loss; modes do not count; skipped top-level names are left out.
func TestVerifyTree(t *testing.T) {
	e := newEnv(t, localBackend())
	src := sampleTree(t, 7)
	if _, err := e.store.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := e.store.Manifest(ctx(t), "acme", "ck1")
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(src, "hot.json"), []byte("{}"), 0o600))
	must(t, os.Chmod(filepath.Join(src, "pages-1.img"), 0o644))
	if err := chunkstore.VerifyTree(src, m.Entries, "hot.json"); err != nil {
		t.Fatalf("the very tree: %v", err)
	}
	if err := chunkstore.VerifyTree(src, m.Entries); !errdefs.IsDataLoss(err) {
		t.Errorf("an extra file: %v", err)
	}
	p := filepath.Join(src, "sub", "deeper", "core-7.img")
	b, err := os.ReadFile(p)
	must(t, err)
	b[100] ^= 1
	must(t, os.WriteFile(p, b, 0o600))
	if err := chunkstore.VerifyTree(src, m.Entries, "hot.json"); !errdefs.IsDataLoss(err) {
		t.Errorf("a flipped bit: %v", err)
	}
	must(t, os.Remove(p))
	if err := chunkstore.VerifyTree(src, m.Entries, "hot.json"); !errdefs.IsDataLoss(err) {
		t.Errorf("a missing file: %v", err)
	}
}
