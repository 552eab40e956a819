package gvisor

import (
	"context"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// Files implements sandbox.Driver. A sandbox whose init is the agent (spec
// generation 2) has its files served by the agent, inside the sandbox's
// mount namespace (agent.FS): what its processes see, the tmpfs mounts
// they made included. hostFiles serves the rest: sandboxes of the sh
// init's generations, a sandbox that does not run, an agent build without
// the file calls, and TarOut/TarIn.
func (d *Driver) Files(ctx context.Context, id string) (sandbox.FS, error) {
	host, rec, err := d.hostFiles(id)
	if err != nil {
		return nil, err
	}
	if rec.SpecVersion < 2 {
		return host, nil
	}
	return &agent.FS{Host: host, Agent: func(ctx context.Context) *agent.Client {
		rec, err := d.running(id)
		if err != nil || rec.SpecVersion < 2 || cgroupEmpty(rec.Cgroup) {
			return nil
		}
		return d.agentFor(rec)
	}}, nil
}

// cgroupEmpty says whether the sandbox's cgroup exists and holds no
// process: the sandbox does not run (killed, crashed, or stopped by a
// checkpoint), so its files are the layer's, served without a dial that
// would fail (a `runsc port-forward` and a `runsc state` per call). A
// cgroup that cannot be read says nothing: the agent is asked.
func cgroupEmpty(path string) bool {
	pids, ok := readCgroupProcs(path)
	return ok && len(pids) == 0
}

// hostFiles is drivers/internal/confinedfs over the layer's merged
// directory, the very directory runsc serves as the sandbox's root.
// Because the root is mounted with --file-access=shared, the sandbox
// revalidates what it has cached against the host on every access, so a
// file written here is what the next read inside sees, and the other way
// round (runsc itself writes through to the host: --overlay2=none). The
// layer is mounted again if a host reboot unmounted it, so the files of a
// stopped sandbox stay reachable.
func (d *Driver) hostFiles(id string) (*confinedfs.FS, *record, error) {
	if err := validID(id); err != nil {
		return nil, nil, errdefs.NotFoundf("sandbox %s", id)
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return nil, nil, err
	}
	l, err := layer.Open(d.layerDir(id))
	if err != nil {
		return nil, nil, err
	}
	fs, err := confinedfs.New(l.Merged())
	if err != nil {
		return nil, nil, err
	}
	return fs, rec, nil
}
