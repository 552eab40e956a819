// Package console holds Amber's web console: a single-page app (Preact,
// built with Vite; sources in src/) that is a client of the public API
// only. Its built assets (dist/, committed so that building amber needs no
// npm) are embedded here and served by the daemon at /console/
// (internal/edge/server/console.go). `make console` rebuilds dist/ and records
// the hash of the sources it was built from in dist/SOURCE_HASH;
// TestBuildIsFresh fails when the sources changed since.
//
// May import: nothing of Amber's.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// Assets returns the built console (index.html at its root).
func Assets() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // dist is embedded at build time: cannot happen
	}
	return sub
}

// Sources are the files the build reads, relative to the console's
// directory: a change to any of them makes dist/ stale.
var Sources = []string{"index.html", "package.json", "package-lock.json", "vite.config.js", "src", "public"}

// SourceHash hashes the console's sources under dir (the console's
// directory): every file of Sources, in path order, as its slash path, its
// length and its content.
func SourceHash(dir string) (string, error) {
	var files []string
	for _, s := range Sources {
		err := filepath.WalkDir(filepath.Join(dir, s), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				rel, err := filepath.Rel(dir, p)
				if err != nil {
					return err
				}
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("console sources: %w", err)
		}
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// BuiltHash is the source hash dist/ records (dist/SOURCE_HASH).
func BuiltHash() string {
	b, _ := fs.ReadFile(dist, "dist/SOURCE_HASH")
	return strings.TrimSpace(string(b))
}
