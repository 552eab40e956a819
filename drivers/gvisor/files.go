package gvisor

import (
	"context"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// Files implements sandbox.Driver: drivers/internal/confinedfs over the layer's
// merged directory, the very directory runsc serves as the sandbox's root.
// Because the root is mounted with --file-access=shared, the sandbox
// revalidates what it has cached against the host on every access, so a
// file written here is what the next read inside sees, and the other way
// round (runsc itself writes through to the host: --overlay2=none). The
// layer is mounted again if a host reboot unmounted it, so the files of a
// stopped sandbox stay reachable.
func (d *Driver) Files(ctx context.Context, id string) (sandbox.FS, error) {
	if err := validID(id); err != nil {
		return nil, errdefs.NotFoundf("sandbox %s", id)
	}
	if _, err := d.loadRecord(id); err != nil {
		return nil, err
	}
	l, err := layer.Open(d.layerDir(id))
	if err != nil {
		return nil, err
	}
	return confinedfs.New(l.Merged())
}
