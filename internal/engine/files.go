package engine

import (
	"context"
	"io"
	"os"
	"path"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// heldFS is a sandbox's FS whose every operation holds the sandbox's cut
// lock for reading (hold takes it and returns its release; see cutLock),
// so that no file operation runs while a checkpoint archives the layer or
// a restore extracts it. An operation that waited behind a cut past the
// call's wait (cutLocks) fails Unavailable without running.
type heldFS struct {
	fs   sandbox.FS
	hold func(ctx context.Context) (release func(), err error)
}

var _ sandbox.FS = (*heldFS)(nil)

// refuseProc refuses a file write (op) at or under /proc with a 400 that
// says why: /proc is the kernel's view of the sandbox's processes, not
// files; each runtime otherwise answers in its own way (gVisor "operation
// not permitted", a host mount namespace "no such file"), neither of which
// tells the caller that the path, not a permission, is wrong. Only the
// spelled path is checked: the sandbox's FS confines every path anyway,
// and a symlink into /proc fails there.
func refuseProc(op, p string) error {
	if c := path.Clean(p); c == "/proc" || strings.HasPrefix(c, "/proc/") {
		return errdefs.InvalidArgumentf("%s %q: /proc is the kernel's view of the sandbox's processes, not files; the files API does not write there (run a command in the sandbox to change a /proc setting)", op, p)
	}
	return nil
}

func (h *heldFS) ReadFile(ctx context.Context, path string, w io.Writer) error {
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.ReadFile(ctx, path, w)
}

func (h *heldFS) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	if err := refuseProc("write", path); err != nil {
		return err
	}
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.WriteFile(ctx, path, r, mode)
}

func (h *heldFS) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	release, err := h.hold(ctx)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer release()
	return h.fs.Stat(ctx, path)
}

func (h *heldFS) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	release, err := h.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return h.fs.List(ctx, dir)
}

func (h *heldFS) Mkdir(ctx context.Context, path string, mode os.FileMode) error {
	if err := refuseProc("mkdir", path); err != nil {
		return err
	}
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.Mkdir(ctx, path, mode)
}

func (h *heldFS) Remove(ctx context.Context, path string, recursive bool) error {
	if err := refuseProc("remove", path); err != nil {
		return err
	}
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.Remove(ctx, path, recursive)
}

// Rename renames within the sandbox (see sandbox.FS.Rename). It is a file
// write like WriteFile: the API's files/rename route, write scope.
func (h *heldFS) Rename(ctx context.Context, from, to string) error {
	if err := refuseProc("rename", from); err != nil {
		return err
	}
	if err := refuseProc("rename", to); err != nil {
		return err
	}
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.Rename(ctx, from, to)
}

func (h *heldFS) TarOut(ctx context.Context, path string, w io.Writer) error {
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.TarOut(ctx, path, w)
}

func (h *heldFS) TarIn(ctx context.Context, dir string, r io.Reader) error {
	if err := refuseProc("extract a tar into", dir); err != nil {
		return err
	}
	release, err := h.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return h.fs.TarIn(ctx, dir, r)
}
