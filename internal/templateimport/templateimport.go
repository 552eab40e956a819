// Package templateimport turns a root filesystem tarball (for example the
// output of `docker export`, or `tar -C rootfs -c .`) into a template in the
// catalog directory that the daemon reads (internal/engine.Catalog):
//
//	<dir>/<name>-imported-<unix time>-<sha256 of the tarball, 12 hex>/rootfs
//
// Importing the same tarball again under the same name is a no-op that
// returns the existing template: the directory is keyed by the content's
// digest. A different tarball under an existing name makes a newer version
// (the catalog picks the lexically last directory of a name, and the time
// stamp orders them); the old version stays for sandboxes born on it.
//
// # Order
//
// The tarball is hashed while it is copied into a build directory whose name
// starts with "." (the catalog ignores those), extracted there, the tree is
// synced, and only then renamed into place (and the parent directory synced):
// a crash leaves either nothing visible or the whole template.
//
// Extraction uses GNU tar as root with numeric owners and permissions kept
// (a root filesystem needs its owners), refusing members that climb out with
// ".." (GNU tar's default) and skipping device nodes under /dev (the runtimes
// provide /dev). This is an operator's command run on the node, not a tenant
// API: tenants' uploads go through internal/confinedfs.
package templateimport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Result says where the template is.
type Result struct {
	Name    string `json:"name"`
	Dir     string `json:"dir"`
	Digest  string `json:"digest"`
	Existed bool   `json:"existed"`
}

// Import reads a tarball from r and installs it as template name under dir.
func Import(ctx context.Context, dir, name string, r io.Reader) (Result, error) {
	if !validName.MatchString(name) {
		return Result{}, errdefs.InvalidArgumentf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	build, err := os.MkdirTemp(dir, ".import-"+name+"-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(build)

	tarPath := filepath.Join(build, "rootfs.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		return Result{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("read tarball: %w", err)
	}
	if n == 0 {
		return Result{}, errdefs.InvalidArgumentf("the tarball is empty")
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if existing, _ := filepath.Glob(filepath.Join(dir, name+"-imported-*-"+digest[:12])); len(existing) > 0 {
		return Result{Name: name, Dir: existing[len(existing)-1], Digest: "sha256:" + digest, Existed: true}, nil
	}

	rootfs := filepath.Join(build, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Result{}, err
	}
	cmd := exec.CommandContext(ctx, "tar", "-x", "-f", tarPath, "-C", rootfs,
		"--numeric-owner", "--same-permissions", "--same-owner",
		"--exclude=./dev/*", "--exclude=dev/*")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Result{}, errdefs.InvalidArgumentf("the tarball does not extract: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Remove(tarPath); err != nil {
		return Result{}, err
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		if _, lerr := os.Lstat(filepath.Join(rootfs, "bin", "sh")); lerr != nil {
			return Result{}, errdefs.InvalidArgumentf("the tarball has no /bin/sh: sandboxes need a POSIX shell as their init")
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run"} {
		_ = os.MkdirAll(filepath.Join(rootfs, d), 0o755)
	}
	if err := exec.CommandContext(ctx, "sync", "-f", rootfs).Run(); err != nil {
		return Result{}, fmt.Errorf("sync %s: %w", rootfs, err)
	}
	final := filepath.Join(dir, fmt.Sprintf("%s-imported-%010d-%s", name, time.Now().Unix(), digest[:12]))
	if err := os.Rename(build, final); err != nil {
		return Result{}, err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return Result{Name: name, Dir: final, Digest: "sha256:" + digest}, nil
}
