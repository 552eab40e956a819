package confinedfs

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// Rename renames from to to (see core/sandbox.FS): each path's parent is
// resolved inside the root (openat2 RESOLVE_IN_ROOT, rule 1), and the two
// last names are handed to one renameat(2) with the parents' descriptors —
// single names, so neither is followed, and a symlink swapped into either
// parent after it was resolved changes nothing (rule 3). The kernel's
// rename(2) semantics are the contract's: an existing file at to is
// replaced atomically, a directory replaces an empty directory only.
// EXDEV here is a cross-device rename, not an escape:
// ErrFailedPrecondition.
func (f *FS) Rename(ctx context.Context, from, to string) error {
	const op = "rename"
	relFrom, err := parse(op, from)
	if err != nil {
		return err
	}
	relTo, err := parse(op, to)
	if err != nil {
		return err
	}
	if relFrom == "" || relTo == "" {
		return failf(op, from, errdefs.ErrInvalidArgument, "cannot rename the root directory")
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dfrom, bfrom, err := parent(root, relFrom, inRoot)
	if err != nil {
		return wrap(op, from, err)
	}
	defer unix.Close(dfrom)
	dto, bto, err := parent(root, relTo, inRoot)
	if err != nil {
		return wrap(op, to, err)
	}
	defer unix.Close(dto)
	race("rename", dfrom, bfrom)
	err = unix.Renameat(dfrom, bfrom, dto, bto)
	switch err {
	case nil:
		return wrap(op, to, syncDirs(dfrom, dto))
	case unix.EXDEV:
		return failf(op, from, errdefs.ErrFailedPrecondition, "%q is on another filesystem (or a directory of the template's layer)", to)
	}
	return wrap(op, from, err)
}

// syncDirs fsyncs the directories a rename changed, so that it is durable
// once Rename returns, as WriteFile's is.
func syncDirs(a, b int) error {
	if err := syncDir(a); err != nil {
		return err
	}
	var sa, sb unix.Stat_t
	if unix.Fstat(a, &sa) == nil && unix.Fstat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino {
		return nil
	}
	return syncDir(b)
}
