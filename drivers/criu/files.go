package criu

import (
	"context"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
)

// Files implements sandbox.Driver with drivers/internal/confinedfs over the
// sandbox's merged root: every path is resolved by the kernel inside that
// root (openat2 RESOLVE_IN_ROOT), and files it creates are owned by sandbox
// root (host uid HostID), so the sandbox can use them. It works on a
// stopped sandbox too (its layer stays mounted).
func (d *Driver) Files(ctx context.Context, id string) (sandbox.FS, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return nil, err
	}
	root, err := d.ensureRootfs(rec)
	if err != nil {
		return nil, recordErr(id, err)
	}
	fs, err := confinedfs.New(root, confinedfs.WithIDMap(uint32(rec.HostID), uint32(rec.HostID), idsPerSandbox))
	if err != nil {
		return nil, recordErr(id, err)
	}
	return fs, nil
}
