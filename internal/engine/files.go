package engine

import (
	"context"
	"io"
	"os"

	"github.com/amber-run/amber/core/sandbox"
)

// heldFS is a sandbox's FS whose every operation holds the sandbox's cut
// lock for reading (hold takes it and returns its release; see cutLock),
// so that no file operation runs while a checkpoint archives the layer or
// a restore extracts it.
type heldFS struct {
	fs   sandbox.FS
	hold func() (release func())
}

var _ sandbox.FS = (*heldFS)(nil)

func (h *heldFS) ReadFile(ctx context.Context, path string, w io.Writer) error {
	defer h.hold()()
	return h.fs.ReadFile(ctx, path, w)
}

func (h *heldFS) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	defer h.hold()()
	return h.fs.WriteFile(ctx, path, r, mode)
}

func (h *heldFS) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	defer h.hold()()
	return h.fs.Stat(ctx, path)
}

func (h *heldFS) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	defer h.hold()()
	return h.fs.List(ctx, dir)
}

func (h *heldFS) Mkdir(ctx context.Context, path string, mode os.FileMode) error {
	defer h.hold()()
	return h.fs.Mkdir(ctx, path, mode)
}

func (h *heldFS) Remove(ctx context.Context, path string, recursive bool) error {
	defer h.hold()()
	return h.fs.Remove(ctx, path, recursive)
}

// Rename renames within the sandbox (see sandbox.FS.Rename). It is a file
// write like WriteFile: the API's files/rename route, write scope.
func (h *heldFS) Rename(ctx context.Context, from, to string) error {
	defer h.hold()()
	return h.fs.Rename(ctx, from, to)
}

func (h *heldFS) TarOut(ctx context.Context, path string, w io.Writer) error {
	defer h.hold()()
	return h.fs.TarOut(ctx, path, w)
}

func (h *heldFS) TarIn(ctx context.Context, dir string, r io.Reader) error {
	defer h.hold()()
	return h.fs.TarIn(ctx, dir, r)
}
