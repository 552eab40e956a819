package criu

import (
	"context"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
)

// Files implements sandbox.Driver. A sandbox whose init is the agent has
// its files served by the agent, inside the sandbox's mount namespace
// (agent.FS): what its processes see, the tmpfs mounts they made included.
// hostFiles serves the rest: sandboxes made before the agent, a sandbox
// that does not run, an agent build without the file calls, and
// TarOut/TarIn.
func (d *Driver) Files(ctx context.Context, id string) (sandbox.FS, error) {
	host, rec, err := d.hostFiles(id)
	if err != nil {
		return nil, err
	}
	if !rec.hasAgent() {
		return host, nil
	}
	return &agent.FS{Host: host, Agent: func(ctx context.Context) *agent.Client {
		ls, err := d.running(id)
		if err != nil || !ls.rec.hasAgent() {
			return nil
		}
		return d.agentClient(ls)
	}}, nil
}

// hostFiles is drivers/internal/confinedfs over the sandbox's merged root:
// every path is resolved by the kernel inside that root (openat2
// RESOLVE_IN_ROOT), and files it creates are owned by sandbox root (host
// uid HostID), so the sandbox can use them. It works on a stopped sandbox
// too (its layer stays mounted).
func (d *Driver) hostFiles(id string) (*confinedfs.FS, *record, error) {
	if err := validID(id); err != nil {
		return nil, nil, err
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return nil, nil, err
	}
	root, err := d.ensureRootfs(rec)
	if err != nil {
		return nil, nil, recordErr(id, err)
	}
	fs, err := confinedfs.New(root, confinedfs.WithIDMap(uint32(rec.HostID), uint32(rec.HostID), idsPerSandbox))
	if err != nil {
		return nil, nil, recordErr(id, err)
	}
	return fs, rec, nil
}
