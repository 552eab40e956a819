package templatestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// ImportResult says what an import made.
type ImportResult struct {
	Version Version `json:"version"`
	// Existed: the same content was already a version (nothing new made).
	Existed bool `json:"existed"`
	// Previous is the version the tag pointed at before ("" if none or the
	// same).
	Previous string `json:"previous,omitempty"`
}

// Import reads a root filesystem tarball (`docker export`, `tar -C rootfs
// -c .`) from r, makes it a version with defaults d, pushes it to the blob
// store, and moves tag name to it (in that order: see the package
// comment). The same content (tree, defaults, packages) imported again is
// the existing version.
//
// Extraction uses GNU tar as root with numeric owners and permissions kept,
// refusing members that climb out with ".." (GNU tar's default) and
// skipping device nodes under /dev (the runtimes provide /dev). This is an
// operator's action on the node, not a tenant API.
func (s *Store) Import(ctx context.Context, name string, r io.Reader, d Defaults) (ImportResult, error) {
	if !ValidName.MatchString(name) {
		return ImportResult{}, errdefs.InvalidArgumentf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", name)
	}
	build, err := s.BuildDir(name)
	if err != nil {
		return ImportResult{}, err
	}
	defer os.RemoveAll(build)
	tarPath := filepath.Join(build, "rootfs.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		return ImportResult{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ImportResult{}, fmt.Errorf("read tarball: %w", err)
	}
	if n == 0 {
		return ImportResult{}, errdefs.InvalidArgumentf("the tarball is empty")
	}
	rootfs := filepath.Join(build, "rootfs")
	cmd := exec.CommandContext(ctx, "tar", "-x", "-f", tarPath, "-C", rootfs,
		"--numeric-owner", "--same-permissions", "--same-owner",
		"--exclude=./dev/*", "--exclude=dev/*")
	if out, err := cmd.CombinedOutput(); err != nil {
		return ImportResult{}, errdefs.InvalidArgumentf("the tarball does not extract: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Remove(tarPath); err != nil {
		return ImportResult{}, err
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		return ImportResult{}, errdefs.InvalidArgumentf("the tarball has no /bin/sh: sandboxes need a POSIX shell as their init")
	}
	for _, dir := range []string{"proc", "sys", "dev", "tmp", "run"} {
		_ = os.MkdirAll(filepath.Join(rootfs, dir), 0o755)
	}
	return s.addAndTag(ctx, name, build, d, "import:sha256:"+hex.EncodeToString(h.Sum(nil)))
}

// ImportDir is Import from a root filesystem directory on this node (a
// build's output), copied with its owners, modes, links and xattrs.
func (s *Store) ImportDir(ctx context.Context, name, dir string, d Defaults) (ImportResult, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return ImportResult{}, errdefs.InvalidArgumentf("%s is not a directory", dir)
	}
	build, err := s.BuildDir(name)
	if err != nil {
		return ImportResult{}, err
	}
	defer os.RemoveAll(build)
	pr, pw := io.Pipe()
	go func() { _, err := WriteCanonical(dir, pw); pw.CloseWithError(err) }()
	err = Extract(pr, filepath.Join(build, "rootfs"))
	pr.CloseWithError(err)
	if err != nil {
		return ImportResult{}, fmt.Errorf("copy %s: %w", dir, err)
	}
	return s.addAndTag(ctx, name, build, d, "build:"+dir)
}

func (s *Store) addAndTag(ctx context.Context, name, build string, d Defaults, source string) (ImportResult, error) {
	prev := ""
	if tags, err := s.Tags(); err == nil {
		prev = tags[name]
	}
	v, existed, err := s.Add(ctx, name, build, d, source)
	if err != nil {
		return ImportResult{}, err
	}
	if err := s.Tag(ctx, name, v.Digest); err != nil {
		return ImportResult{Version: v, Existed: existed}, err
	}
	if prev == v.Digest {
		prev = ""
	}
	return ImportResult{Version: v, Existed: existed, Previous: prev}, nil
}
