package localfs_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/stores/localfs"
)

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, err := localfs.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// A torn put leaves no temp file behind, and a crash's leftover temp file is
// removed by Open once stale.
func TestTempFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := localfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "k", strings.NewReader("short"), 100); err == nil {
		t.Fatal("short put succeeded")
	}
	if err := blob.PutBytes(ctx, s, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Fatalf("tmp/ holds %v after puts", ents)
	}
	stale := filepath.Join(dir, "tmp", "put-crashed")
	if err := os.WriteFile(stale, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := localfs.Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale temp file still there: %v", err)
	}
}

// Deleting the last object under a directory removes the empty directories.
func TestDeletePrunesDirs(t *testing.T) {
	dir := t.TempDir()
	s, err := localfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := blob.PutBytes(ctx, s, "tenants/a/chunks/ab/abcd", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "tenants/a/chunks/ab/abcd"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "objects")); len(ents) != 0 {
		t.Fatalf("objects/ still holds %v", ents)
	}
}
