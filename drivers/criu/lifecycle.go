package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// reaperScript is the init of sandboxes made before the agent (record.Init
// empty; restored from their checkpoints it still runs): it sleeps and
// reaps orphans (the shell's wait reaps any child, including processes
// re-parented to it), and exits on SIGTERM. It is plain POSIX sh, so it
// runs on busybox and Debian templates alike.
const reaperScript = `trap 'exit 0' TERM; while :; do sleep 86400 & wait; done`

// createLegacy makes Create start sandboxes the way the driver did before
// the agent (the sh reaper as init, libcontainer exec): tests of that path,
// which restored old checkpoints still take, set it.
var createLegacy = false

func legacyInit() *libcontainer.Process {
	return &libcontainer.Process{
		Args: []string{"/bin/sh", "-c", reaperScript},
		Env:  []string{"PATH=" + defaultPath},
		Cwd:  "/",
		Init: true,
	}
}

// liveSandbox is what the driver holds in memory for a sandbox.
type liveSandbox struct {
	c   *libcontainer.Container
	rec *record
	// lazy is the background load of a lazy restore (nil: eager, or
	// loaded before this driver started; lazy.go).
	lazy *lazyLoad
}

// Create implements sandbox.Driver.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (info sandbox.Info, err error) {
	if err := validID(spec.ID); err != nil {
		return sandbox.Info{}, err
	}
	if !seccompSupported {
		return sandbox.Info{}, d.Check(ctx)
	}
	if spec.Template.RootFS == "" || !filepath.IsAbs(spec.Template.RootFS) {
		return sandbox.Info{}, errdefs.InvalidArgumentf("sandbox %s: template rootfs %q: want an absolute host path", spec.ID, spec.Template.RootFS)
	}
	if fi, err := os.Stat(spec.Template.RootFS); err != nil || !fi.IsDir() {
		return sandbox.Info{}, errdefs.FailedPreconditionf("sandbox %s: template %s rootfs %s: not a directory", spec.ID, spec.Template.Name, spec.Template.RootFS)
	}
	if _, _, err := parseUser(spec.Template.User); err != nil {
		return sandbox.Info{}, err
	}
	lim := d.effectiveLimits(spec.Limits, spec.Template.Limits)
	if err := validateLimits(lim); err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	unlock := d.lock(spec.ID)
	defer unlock()

	rec := &record{
		Version:  recordVersion,
		ID:       spec.ID,
		Tenant:   spec.Tenant,
		Template: spec.Template,
		Limits:   lim,
		Env:      spec.Env,
		Created:  time.Now().UTC(),
		Phase:    phaseCreating,
	}
	if !createLegacy {
		rec.Init, rec.AgentBuild = initAgent, d.agentBuild
		if rec.AgentToken, err = newAgentToken(); err != nil {
			return sandbox.Info{}, recordErr(spec.ID, err)
		}
	}
	// Claim the id (its record directory) and then a uid range.
	if err := os.Mkdir(d.recordDir(spec.ID), 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return sandbox.Info{}, errdefs.AlreadyExistsf("sandbox %s", spec.ID)
		}
		return sandbox.Info{}, recordErr(spec.ID, err)
	}
	if _, err := os.Lstat(filepath.Join(d.runc, spec.ID)); err == nil {
		_ = os.Remove(d.recordDir(spec.ID))
		return sandbox.Info{}, errdefs.AlreadyExistsf("sandbox %s (libcontainer state left over; destroy it first)", spec.ID)
	}
	slot, err := d.claimSlot(spec.ID)
	if err == nil {
		rec.Slot = slot
		rec.HostID = d.opts.UIDBase + slot*idsPerSandbox
		if err = d.saveRecord(rec); err != nil {
			_ = d.releaseSlot(spec.ID, slot)
		}
	}
	if err != nil {
		_ = os.RemoveAll(d.recordDir(spec.ID))
		return sandbox.Info{}, recordErr(spec.ID, err)
	}

	defer func() {
		if err != nil {
			if derr := d.destroyLocked(context.WithoutCancel(ctx), spec.ID); derr != nil {
				d.log.Error("cleanup after failed create", "sandbox", spec.ID, "err", derr)
			}
		}
	}()

	rootfs, err := d.mountRootfs(rec)
	if err != nil {
		return sandbox.Info{}, recordErr(spec.ID, err)
	}
	if err := d.prepareRootfs(ctx, rec, rootfs); err != nil {
		return sandbox.Info{}, recordErr(spec.ID, err)
	}
	agentBin, err := d.agentBinary(rec)
	if err != nil {
		return sandbox.Info{}, err
	}
	c, err := libcontainer.Create(d.runc, spec.ID, d.containerConfig(rec, rootfs, agentBin))
	if err != nil {
		return sandbox.Info{}, recordErr(spec.ID, fmt.Errorf("libcontainer create: %w", err))
	}
	init := agentInit(rec)
	if !rec.hasAgent() {
		init = legacyInit()
	}
	if err := c.Run(init); err != nil {
		return sandbox.Info{}, recordErr(spec.ID, fmt.Errorf("start init: %w", err))
	}
	// The init is our child: reap it when it dies, or it stays a zombie
	// and the sandbox looks alive.
	go func() { _, _ = init.Wait() }()
	pid, _ := init.Pid()
	if err := d.plumb(ctx, spec.ID, pid); err != nil {
		return sandbox.Info{}, recordErr(spec.ID, err)
	}

	rec.Phase = phaseCreated
	if err := d.saveRecord(rec); err != nil {
		return sandbox.Info{}, recordErr(spec.ID, err)
	}
	ls := &liveSandbox{c: c, rec: rec}
	d.mu.Lock()
	d.live[spec.ID] = ls
	d.mu.Unlock()
	// Create returns once the agent answers: the first Exec does not wait.
	if rec.hasAgent() {
		if err := d.waitAgent(ctx, ls); err != nil {
			return sandbox.Info{}, err
		}
	}
	d.log.Info("sandbox created", "sandbox", spec.ID, "template", spec.Template.Name, "init_pid", pid, "host_uid", rec.HostID)
	return sandbox.Info{ID: spec.ID, State: sandbox.StateRunning, Created: rec.Created, InitPID: pid}, nil
}

// prepareRootfs makes what the driver itself relies on inside the sandbox:
// /run/amber/proc for the logs of background processes, writable by every
// sandbox user (sticky, like /tmp), so Start works for a non-root template
// user too. First it refuses a root whose mount points are not real
// directories (layer.CheckMountPoints: by descriptor, naming the path).
func (d *Driver) prepareRootfs(ctx context.Context, rec *record, rootfs string) error {
	if err := layer.CheckMountPoints(rootfs, rootMountPoints...); err != nil {
		return err
	}
	fs, err := confinedfs.New(rootfs, confinedfs.WithIDMap(uint32(rec.HostID), uint32(rec.HostID), idsPerSandbox))
	if err != nil {
		return err
	}
	if err := fs.Mkdir(ctx, "/run/amber", 0o755); err != nil {
		return err
	}
	return fs.Mkdir(ctx, "/run/amber/proc", 0o1777)
}

// container returns the sandbox's libcontainer container, loading it from
// the state directory when this process did not create it.
func (d *Driver) container(id string) (*liveSandbox, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	d.mu.Lock()
	ls, ok := d.live[id]
	d.mu.Unlock()
	if ok {
		return ls, nil
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return nil, err
	}
	c, err := libcontainer.Load(d.runc, id)
	if err != nil {
		if errors.Is(err, libcontainer.ErrNotExist) {
			return nil, errdefs.FailedPreconditionf("sandbox %s: not started (creation did not finish); destroy it", id)
		}
		return nil, recordErr(id, fmt.Errorf("load container: %w", err))
	}
	ls = &liveSandbox{c: c, rec: rec}
	d.mu.Lock()
	if cur, ok := d.live[id]; ok {
		ls = cur
	} else {
		d.live[id] = ls
	}
	d.mu.Unlock()
	return ls, nil
}

// Inspect implements sandbox.Driver.
func (d *Driver) Inspect(ctx context.Context, id string) (sandbox.Info, error) {
	if err := validID(id); err != nil {
		return sandbox.Info{}, err
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			if _, serr := os.Lstat(filepath.Join(d.runc, id)); serr == nil {
				// Only libcontainer's directory is left: a half-created or
				// half-destroyed sandbox.
				return sandbox.Info{ID: id, State: sandbox.StateUnknown}, nil
			}
		}
		return sandbox.Info{}, err
	}
	info := sandbox.Info{ID: id, Created: rec.Created, State: sandbox.StateUnknown}
	ls, err := d.container(id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return sandbox.Info{}, err
		}
		return info, nil
	}
	st, err := ls.c.Status()
	if err != nil {
		return info, nil
	}
	switch st {
	case libcontainer.Running, libcontainer.Paused:
		info.State = sandbox.StateRunning
		if s, err := ls.c.State(); err == nil {
			info.InitPID = s.InitProcessPid
		}
	case libcontainer.Stopped:
		info.State = sandbox.StateStopped
	}
	return info, nil
}

// List implements sandbox.Driver.
func (d *Driver) List(ctx context.Context) ([]sandbox.Info, error) {
	ids, err := d.ids()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	out := make([]sandbox.Info, 0, len(ids))
	for _, id := range ids {
		info, err := d.Inspect(ctx, id)
		if errdefs.IsNotFound(err) {
			continue // destroyed meanwhile
		}
		if err != nil {
			info = sandbox.Info{ID: id, State: sandbox.StateUnknown}
		}
		out = append(out, info)
	}
	return out, nil
}

// Kill implements sandbox.Driver: freeze the cgroup, SIGKILL every process
// in it, thaw, and wait until it is empty. Freezing first means no process
// can fork a child that escapes the kill. The writable layer, the cgroup and
// the container's state stay (a restore reuses them).
func (d *Driver) Kill(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	ls, err := d.container(id)
	if err != nil {
		return err
	}
	err = d.killAll(ctx, ls.c)
	ls.lazy.stop()         // nothing left to serve pages to
	d.dropAgent(id, false) // its streams find the sandbox stopped (Client.Alive)
	return err
}

// killAll kills every process of c and waits until libcontainer sees the
// container stopped: a process leaves its cgroup a moment before it is a
// zombie, and until then libcontainer still counts the init as running.
func (d *Driver) killAll(ctx context.Context, c *libcontainer.Container) error {
	cfg := c.Config()
	cm, err := manager.New(cfg.Cgroups)
	if err != nil {
		return err
	}
	if err := killCgroup(ctx, cm); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status()
		if err != nil || st == libcontainer.Stopped {
			return err
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("container %s still %s after SIGKILL", c.ID(), st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// killCgroup SIGKILLs every process of a cgroup and waits (up to 10 s) for
// it to be empty.
func killCgroup(ctx context.Context, cm cgroups.Manager) error {
	if !cm.Exists() {
		return nil
	}
	frozen := cm.Freeze(cgroups.Frozen) == nil
	pids, err := cm.GetAllPids()
	if err != nil && !isNotExist(err) {
		if frozen {
			_ = cm.Freeze(cgroups.Thawed)
		}
		return err
	}
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	if frozen {
		if err := cm.Freeze(cgroups.Thawed); err != nil {
			return fmt.Errorf("thaw: %w", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := cm.GetAllPids()
		if err != nil || len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("%d processes still in cgroup after SIGKILL", len(pids))
		}
		for _, pid := range pids { // forked between listing and freezing (no freezer)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Destroy implements sandbox.Driver. Every step tolerates its object being
// absent, so Destroy finishes a half-created or half-destroyed sandbox.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	unlock := d.lock(id)
	defer unlock()
	return d.destroyLocked(ctx, id)
}

// destroyLocked destroys sandbox id, its egress plumbing included; the
// caller holds its lock.
func (d *Driver) destroyLocked(ctx context.Context, id string) error {
	return d.destroySandbox(ctx, id, false)
}

// destroySandbox is destroyLocked; keepNetwork leaves the egress plumbing
// (the gateway namespace, its listener and the gateway's ends of the
// sandbox's connections) in place for a restore of the same sandbox
// (network.go).
func (d *Driver) destroySandbox(ctx context.Context, id string, keepNetwork bool) error {
	d.mu.Lock()
	ls := d.live[id]
	delete(d.live, id)
	d.mu.Unlock()
	if ls != nil {
		defer ls.lazy.stop() // after the kill: its pages are served until then
	}
	d.dropAgent(id, true)
	var errs []error
	// 0. A restore cut off by a kill leaves libcontainer's bind mount of
	// the rootfs at <state>/criu-root (its deferred unmount never ran):
	// the state directory cannot go (EBUSY), and the sandbox could be
	// neither destroyed nor restored again (chaos seed 9501, criu: a
	// sandbox whose restore a daemon kill cut off was refused after).
	unmountCriuRoot(filepath.Join(d.runc, id, "criu-root"))
	// 1. The container: kill its processes, wait until it is stopped, and
	// let libcontainer remove its cgroups and state directory.
	if c, err := libcontainer.Load(d.runc, id); err == nil {
		if err := d.killAll(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("kill: %w", err))
		} else if err := c.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("libcontainer destroy: %w", err))
		}
	}
	// 2. What libcontainer has no state for (Create failed or crashed
	// before the container started): the cgroups, found by their path,
	// which derives from the id, and the bare state directory.
	cg := &cgroups.Cgroup{Path: filepath.Join(d.opts.CgroupParent, id), Resources: &cgroups.Resources{}}
	if cm, err := manager.New(cg); err != nil {
		errs = append(errs, err)
	} else if err := killCgroup(ctx, cm); err != nil {
		errs = append(errs, fmt.Errorf("kill: %w", err))
	} else if err := cm.Destroy(); err != nil && !isNotExist(err) {
		errs = append(errs, fmt.Errorf("remove cgroups: %w", err))
	}
	if err := os.RemoveAll(filepath.Join(d.runc, id)); err != nil {
		errs = append(errs, err)
	}
	// 3. The egress plumbing (the sandbox's namespace went with its
	// processes).
	if !keepNetwork {
		if err := d.unplumb(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// 4. The writable layer and the record, last: while the record exists,
	// List reports the sandbox and a repeated Destroy retries.
	if err := d.unmountRootfs(id); err != nil {
		errs = append(errs, fmt.Errorf("rootfs: %w", err))
	} else if err := d.destroyLayerRetry(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("layer: %w", err))
	}
	if len(errs) == 0 {
		slot := -1
		if rec, err := d.loadRecord(id); err == nil {
			slot = rec.Slot
		}
		if err := d.releaseSlot(id, slot); err != nil {
			errs = append(errs, fmt.Errorf("release uid range: %w", err))
		} else if err := os.RemoveAll(d.recordDir(id)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return recordErr(id, fmt.Errorf("destroy: %w", err))
	}
	d.log.Info("sandbox destroyed", "sandbox", id)
	return nil
}

// destroyLayerRetry destroys the sandbox's layer, retrying for a while when
// its loop device is still held: the kernel releases a loop device
// asynchronously after the last unmount, which takes longer on a loaded host.
func (d *Driver) destroyLayerRetry(ctx context.Context, id string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := destroyLayer(d.layerDir(id))
		if err == nil || !errdefs.IsUnavailable(err) || time.Now().After(deadline) {
			return err
		}
		d.log.Debug("layer busy, retrying", "sandbox", id, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// legacyUIDBase and legacyMaxSandboxes are the defaults of drivers before
// issue 18, whose ranges began at 100000, the first range useradd writes
// to /etc/subuid. Their checkpoints record host ids on that grid, and a
// CRIU image holds host ids, so such an image restores only into the range
// it was cut in (slotOf).
const (
	legacyUIDBase      = 100000
	legacyMaxSandboxes = 4096
	// legacySlots numbers the claims of legacy ranges (legacySlots + n
	// for range n), apart from this driver's own 0..MaxSandboxes-1: a
	// claim file is per number, and a legacy range n and this driver's
	// range n are different host ids.
	legacySlots = 1 << 20
)

// slotOf returns the claim number of the uid range starting at hostID, the
// range a checkpoint image records: one of this driver's ranges, or a
// range of the legacy default grid (a checkpoint made before the default
// base moved) provided that grid and this driver's do not overlap. The
// legacy range overlaps /etc/subuid's usual first range, as it did when
// the image was made; the restored sandbox keeps it until destroyed, and
// every sandbox created here gets a range of its own grid.
func (d *Driver) slotOf(hostID int) (int, error) {
	if rel := hostID - d.opts.UIDBase; rel >= 0 && rel%idsPerSandbox == 0 && rel/idsPerSandbox < d.opts.MaxSandboxes {
		return rel / idsPerSandbox, nil
	}
	own0, own1 := d.opts.UIDBase, d.opts.UIDBase+d.opts.MaxSandboxes*idsPerSandbox
	leg0, leg1 := legacyUIDBase, legacyUIDBase+legacyMaxSandboxes*idsPerSandbox
	if rel := hostID - legacyUIDBase; rel >= 0 && rel%idsPerSandbox == 0 && rel/idsPerSandbox < legacyMaxSandboxes && (leg1 <= own0 || own1 <= leg0) {
		d.log.Warn("restoring a checkpoint into the uid range of the old default base (overlaps /etc/subuid's usual first range); new sandboxes get ranges from the current base", "host_uid", hostID, "base", d.opts.UIDBase)
		return legacySlots + rel/idsPerSandbox, nil
	}
	return 0, errdefs.FailedPreconditionf("image's uid range starts at %d, outside this driver's ranges (base %d) and the old default's (base %d); restoring into another range is not supported", hostID, d.opts.UIDBase, legacyUIDBase)
}

// unmountCriuRoot detaches every mount at p (libcontainer's bind mount of
// a restore's rootfs, possibly stacked), if any.
func unmountCriuRoot(p string) {
	for i := 0; i < 8; i++ {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			return // EINVAL: not a mount point (any more); ENOENT: gone
		}
	}
}
