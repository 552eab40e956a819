package criu

import (
	"context"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Files implements sandbox.Driver.
func (d *Driver) Files(ctx context.Context, id string) (sandbox.FS, error) {
	if _, err := d.container(id); err != nil {
		return nil, err
	}
	return nil, errdefs.NotImplementedf("criu driver: files (waits for internal/confinedfs)")
}
