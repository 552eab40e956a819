package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/internal/engine"
)

// TestCleanWorkDirKeepsTheHotTier: a start removes the cuts, fetches and
// link trees a crashed daemon left, and keeps the hot tier's copies (the
// only image of a checkpoint whose upload is pending).
func TestCleanWorkDirKeepsTheHotTier(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	hotFile := filepath.Join(work, engine.HotTierDir, "ckpt-a", "hot.json")
	garbage := []string{filepath.Join(work, "cut-ckpt-b", "pages.img"), filepath.Join(work, "fetch-x", "layer.tar"), filepath.Join(work, "stray")}
	for _, p := range append([]string{hotFile}, garbage...) {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := cleanWorkDir(work, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(hotFile); err != nil {
		t.Fatalf("the hot tier's copy is gone: %v", err)
	}
	ents, _ := os.ReadDir(work)
	if len(ents) != 1 || ents[0].Name() != engine.HotTierDir {
		t.Fatalf("work dir after the clean: %v, want only %s", ents, engine.HotTierDir)
	}
	// A missing work dir is made.
	fresh := filepath.Join(t.TempDir(), "work")
	if err := cleanWorkDir(fresh, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(fresh); err != nil || !st.IsDir() {
		t.Fatalf("work dir not made: %v", err)
	}
}
