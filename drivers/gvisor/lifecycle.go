package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// tmpKeep is an empty file the driver keeps in the sandbox's /tmp, so that
// /tmp is never empty at boot (runsc mounts a tmpfs over an empty /tmp that
// the spec does not mount; the spec binds it, see ociSpec, and the file
// keeps older bundles' behaviour the same). It is created relative to a
// descriptor of /tmp opened by prepareRoot, never by name.
const tmpKeep = ".amber-keep"

// Create implements sandbox.Driver. The order below is chosen so that a
// crash at any point leaves something Destroy removes: the record (phase
// "creating") first, then the layer, the network namespace, the bundle,
// and the runtime.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (_ sandbox.Info, err error) {
	id := spec.ID
	if err := validID(id); err != nil {
		return sandbox.Info{}, err
	}
	if spec.Template.RootFS == "" {
		return sandbox.Info{}, errdefs.InvalidArgumentf("sandbox %s: template has no rootfs", id)
	}
	if st, err := os.Stat(spec.Template.RootFS); err != nil || !st.IsDir() || !filepath.IsAbs(spec.Template.RootFS) {
		return sandbox.Info{}, errdefs.InvalidArgumentf("sandbox %s: template rootfs %q is not an absolute path of a directory", id, spec.Template.RootFS)
	}
	uid, gid, err := parseUser(spec.Template.User)
	if err != nil {
		return sandbox.Info{}, err
	}
	unlock := d.lock(id)
	defer unlock()
	if err := os.Mkdir(d.dir(id), 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return sandbox.Info{}, errdefs.AlreadyExistsf("sandbox %s", id)
		}
		return sandbox.Info{}, err
	}
	cwd := spec.Template.Cwd
	if cwd == "" {
		cwd = "/"
	}
	rec := &record{
		Version:      recordVersion,
		ID:           id,
		Tenant:       spec.Tenant,
		Template:     spec.Template,
		Limits:       mergeLimits(mergeLimits(spec.Limits, spec.Template.Limits), d.limits),
		Env:          mergeEnv(uid, spec.Template.Env, spec.Env),
		Cwd:          cwd,
		UID:          uid,
		GID:          gid,
		RunscFlags:   append([]string(nil), d.flags...),
		RunscVersion: PinnedVersion,
		SpecVersion:  createSpecVersion,
		Cgroup:       d.cgroupPath(id),
		Netns:        d.netnsPath(id),
		Created:      time.Now().UTC(),
		Phase:        phaseCreating,
	}
	if rec.SpecVersion >= 2 {
		rec.AgentBuild = d.agentBuild
		if rec.AgentToken, err = newAgentToken(); err != nil {
			return sandbox.Info{}, err
		}
	}
	defer func() {
		if err != nil {
			// A background context: the caller's may be what failed.
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if derr := d.destroy(dctx, id); derr != nil {
				d.log.Warn("cleanup after failed create", "sandbox", id, "err", derr)
			}
		}
	}()
	if err := d.saveRecord(rec); err != nil {
		return sandbox.Info{}, err
	}
	t0 := time.Now()
	l, err := layer.Create(d.layerDir(id), spec.Template.RootFS, rec.Limits.DiskBytes)
	d.log.Debug("create: layer", "sandbox", id, "took", time.Since(t0))
	if err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: layer: %w", id, err)
	}
	if err := prepareRoot(l.Merged()); err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	d.log.Debug("create: root prepared", "sandbox", id, "took", time.Since(t0))
	if err := createNetns(rec.Netns); err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if d.opts.Network != nil {
		if err := d.opts.Network.Plumb(ctx, id, rec.Netns); err != nil {
			return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	d.log.Debug("create: netns", "sandbox", id, "took", time.Since(t0))
	if err := d.writeBundle(rec, l.Merged()); err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: bundle: %w", id, err)
	}
	pid, err := d.boot(ctx, rec, l.Merged())
	if err != nil {
		return sandbox.Info{}, err
	}
	d.log.Debug("create: booted", "sandbox", id, "took", time.Since(t0))
	if rec.SpecVersion >= 2 {
		if err := d.waitAgent(ctx, rec); err != nil {
			return sandbox.Info{}, err
		}
		d.log.Debug("create: agent ready", "sandbox", id, "took", time.Since(t0))
	}
	rec.Phase = phaseCreated
	if err := d.saveRecord(rec); err != nil {
		return sandbox.Info{}, err
	}
	d.log.Info("sandbox created", "sandbox", id, "limits", rec.Limits)
	return sandbox.Info{ID: id, State: sandbox.StateRunning, Created: rec.Created, InitPID: pid}, nil
}

// prepareRoot makes what the driver needs in a root about to boot (fresh,
// or just restored from a checkpoint's layer) and refuses a root the
// runtime must not be started on. /tmp is made if the template lacks it;
// then every mount point in the layer (rootMountPoints) must be a real
// directory or absent: a /tmp that is a symlink (planted through Files, or
// restored from a checkpoint's layer) fails with an error naming it, and
// nothing is started. Everything is resolved by the kernel inside the root
// and by descriptor (drivers/internal/layer.OpenMountPoint), so a symlink never
// makes the daemon write on the host. Nothing is fsynced: the file is
// re-made before every boot.
func prepareRoot(root string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	created := false
	if err := unix.Mkdirat(rfd, "tmp", 0o777); err == nil {
		created = true
	} else if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir /tmp: %w", err)
	}
	if err := layer.CheckMountPoints(root, rootMountPoints...); err != nil {
		return err
	}
	tmp, err := layer.OpenMountPoint(rfd, "/tmp")
	if err != nil {
		return err
	}
	defer tmp.Close()
	if created {
		// mkdir's mode is masked by umask. The O_PATH descriptor is
		// the directory just checked; chmod it through /proc.
		_ = os.Chmod(fmt.Sprintf("/proc/self/fd/%d", tmp.Fd()), 0o1777|os.ModeSticky)
	}
	fd, err := unix.Openat(int(tmp.Fd()), tmpKeep, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("create /tmp/%s: %w", tmpKeep, err)
	}
	return unix.Close(fd)
}

// mountSource is the source ociSpec gives runsc for the /tmp bind:
// <dir>/mnt/tmp, in the sandbox's directory (0700, root's), which no tenant
// name reaches. withMountSources binds the layer's /tmp there by
// descriptor for the time the runtime starts.
func (d *Driver) mountSource(id string) string { return filepath.Join(d.dir(id), "mnt", "tmp") }

// withMountSources runs start (runsc run or runsc restore of the bundle
// writeBundle wrote) with the layer's /tmp bound at mountSource, and
// removes the bind when start returns.
//
// The race this closes: runsc resolves a bind's source by name on the
// host, so a source inside the layer (rootfs+"/tmp", as before) could be
// swapped for a symlink after any check and before runsc's mount (through
// Files, which does not take the driver's lock). Here the check and the
// bind are one step: drivers/internal/layer.BindMountPoint opens /tmp by
// descriptor (openat2 RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS), refuses
// anything but a real directory, and binds that very directory
// (/proc/self/fd/N) at mountSource. Renaming or replacing /tmp in the
// layer afterwards changes nothing runsc sees. runsc's gofer binds the
// source into the sandbox during start; once start returns the sandbox
// holds its own mount and the driver's bind is removed, so the host's
// mount table is as before. runsc restore does not compare mount sources
// with the checkpoint's, so images made with the old source restore.
func (d *Driver) withMountSources(rec *record, rootfs string, start func() error) (err error) {
	src := d.mountSource(rec.ID)
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	if err := layer.UnbindMountPoint(src); err != nil { // left by a crash
		return err
	}
	if err := layer.BindMountPoint(rootfs, "/tmp", src); err != nil {
		return err
	}
	defer func() {
		if uerr := layer.UnbindMountPoint(src); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return start()
}

// writeBundle writes <dir>/bundle/config.json.
func (d *Driver) writeBundle(rec *record, rootfs string) error {
	if err := os.MkdirAll(d.bundleDir(rec.ID), 0o700); err != nil {
		return err
	}
	agentSrc, err := d.agentSource(rec)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(ociSpec(rec, rootfs, d.mountSource(rec.ID), agentSrc), "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(d.bundleDir(rec.ID), "config.json"), b, 0o600)
}

// boot runs `runsc run --detach`: create the sandbox (gofer and gVisor
// kernel processes, cgroups) and start its init. The init's stdio is
// /dev/null: anything else would be a host file or pipe the sandbox could
// reach through /proc/1/fd forever. runsc's own errors go to the --log
// file.
func (d *Driver) boot(ctx context.Context, rec *record, rootfs string) (pid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	logFile := filepath.Join(d.dir(rec.ID), "runsc.log")
	pidFile := filepath.Join(d.dir(rec.ID), "sandbox.pid")
	_ = os.Remove(logFile)
	_ = os.Remove(pidFile)
	args := append(d.globalFlags(rec, logFile), "run", "--detach", "--pid-file="+pidFile,
		"--bundle="+d.bundleDir(rec.ID), runtimeID(rec.ID))
	cmd := d.command(ctx, args...)
	var runErr error
	if err := d.withMountSources(rec, rootfs, func() error { runErr = cmd.Run(); return nil }); err != nil {
		return 0, fmt.Errorf("sandbox %s: %w", rec.ID, err)
	}
	if runErr != nil {
		msg := strings.Join(logMessages(logFile), "; ")
		return 0, fmt.Errorf("sandbox %s: runsc run: %v: %s", rec.ID, runErr, msg)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: runsc run wrote no pid file: %w", rec.ID, err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Inspect implements sandbox.Driver.
func (d *Driver) Inspect(ctx context.Context, id string) (sandbox.Info, error) {
	if err := validID(id); err != nil {
		return sandbox.Info{}, errdefs.NotFoundf("sandbox %s", id)
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			if _, serr := os.Stat(d.dir(id)); serr == nil {
				// A create that crashed before writing its record.
				return sandbox.Info{ID: id, State: sandbox.StateUnknown}, nil
			}
		}
		return sandbox.Info{}, err
	}
	return d.inspect(ctx, rec)
}

func (d *Driver) inspect(ctx context.Context, rec *record) (sandbox.Info, error) {
	st, ok, err := d.state(ctx, rec, rec.ID)
	if err != nil {
		return sandbox.Info{}, err
	}
	return infoOf(rec, st, ok), nil
}

// infoOf maps runsc's status of a sandbox to the contract's states. A
// "paused" sandbox (frozen by a checkpoint in progress) still has its
// processes and counts as running.
func infoOf(rec *record, st containerState, known bool) sandbox.Info {
	info := sandbox.Info{ID: rec.ID, Created: rec.Created, State: sandbox.StateUnknown}
	switch {
	case !known:
		if rec.Phase == phaseCreated {
			// runsc forgot it (its root was cleaned): nothing runs.
			info.State = sandbox.StateStopped
		}
	case st.Status == "running" || st.Status == "paused":
		info.State = sandbox.StateRunning
		info.InitPID = st.Pid
	case st.Status == "stopped":
		info.State = sandbox.StateStopped
	}
	return info
}

// List implements sandbox.Driver: every sandbox directory, with the state
// runsc reports for it (one `runsc list` for all of them).
func (d *Driver) List(ctx context.Context) ([]sandbox.Info, error) {
	ents, err := os.ReadDir(d.sbxDir)
	if err != nil {
		return nil, err
	}
	states, err := d.list(ctx)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Info
	for _, e := range ents {
		if !e.IsDir() || validID(e.Name()) != nil {
			continue
		}
		rec, err := d.loadRecord(e.Name())
		if err != nil {
			if errdefs.IsNotFound(err) {
				out = append(out, sandbox.Info{ID: e.Name(), State: sandbox.StateUnknown})
				continue
			}
			return nil, err
		}
		st, ok := states[rec.ID]
		out = append(out, infoOf(rec, st, ok))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Kill implements sandbox.Driver: SIGKILL to every process of the sandbox
// (`runsc kill --all`). The init dies with the rest, so the gVisor kernel
// exits; Kill returns once no host process of the sandbox is left. The
// writable layer, the network namespace and the runtime's record stay, so
// that Destroy, or a restore, finds them. A sandbox a dead daemon's cut
// left paused ignores runsc kill: its host processes are killed at once
// (leftover.go).
func (d *Driver) Kill(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return errdefs.NotFoundf("sandbox %s", id)
	}
	unlock := d.lock(id)
	defer unlock()
	rec, err := d.loadRecord(id)
	if err != nil {
		return err
	}
	d.dropAgent(id)
	if d.leftPaused(id) {
		// A paused sentry ignores runsc kill: the waits below ran out
		// (10 s, then 5 s for the cgroup) before its host processes
		// were killed — the chaos run's slowest recoveries after a
		// daemon kill mid-cut (leftover.go). It is stopped at once, as
		// a LeaveStopped cut stops its sandbox.
		d.log.Warn("sandbox was left paused by a cut that did not end (the daemon stopped during it); killing its host processes", "sandbox", id)
		if err := d.stopPaused(rec); err != nil {
			return fmt.Errorf("kill %s (left paused): %w", id, err)
		}
		d.log.Info("sandbox killed", "sandbox", id)
		return nil
	}
	if _, err := d.run(ctx, rec, "kill", "--all", runtimeID(id), "KILL"); err != nil {
		st, ok, serr := d.state(ctx, rec, id)
		if serr != nil || (ok && st.Status == "running") {
			return classify(id, err)
		}
		// Already stopped (or unknown to runsc): nothing to kill.
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, ok, err := d.state(ctx, rec, id)
		if err != nil {
			return err
		}
		if !ok || st.Status == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			d.log.Warn("sandbox does not stop after runsc kill; killing its host processes", "sandbox", id)
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	// The gofer and the gVisor kernel leave shortly after the init; make
	// sure nothing of the sandbox runs on the host any more.
	if err := waitCgroupEmpty(ctx, rec.Cgroup, 5*time.Second); err != nil {
		if err := killCgroup(rec.Cgroup, 10*time.Second); err != nil {
			return err
		}
	}
	// Kill's promise is that Inspect then says stopped: runsc's state can
	// lag behind its kill (a transient "unknown" above ends the first
	// wait early), so wait for it here too.
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, ok, err := d.state(ctx, rec, id)
		if err != nil {
			return err
		}
		if info := infoOf(rec, st, ok); info.State != sandbox.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("sandbox %s: runsc still reports it running 10s after the kill", id)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	d.clearCut(id) // a cut whose resume failed: nothing of it runs now
	d.log.Info("sandbox killed", "sandbox", id)
	return nil
}

// Destroy implements sandbox.Driver. Each step works from the id alone, so
// it also removes a half-created sandbox, and repeating it is harmless.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return nil // no such sandbox can exist
	}
	unlock := d.lock(id)
	defer unlock()
	d.dropAgent(id)
	if err := d.destroy(ctx, id); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	d.log.Info("sandbox destroyed", "sandbox", id)
	return nil
}

// destroy undoes Create from the top. The caller holds the id's lock.
func (d *Driver) destroy(ctx context.Context, id string) error {
	rec, _ := d.loadRecord(id) // nil for a half-created sandbox
	cg := d.cgroupPath(id)
	if rec != nil && rec.Cgroup != "" {
		cg = rec.Cgroup
	}
	// 1. The runtime: processes, runsc's state, its cgroups.
	if d.runtimeStateExists(id) {
		if _, err := d.run(ctx, rec, "delete", "--force", runtimeID(id)); err != nil && !notExist(err) {
			d.log.Warn("runsc delete failed; removing by hand", "sandbox", id, "err", err)
		}
	}
	if err := killCgroup(cg, 10*time.Second); err != nil {
		return err
	}
	if err := d.removeRuntimeState(id); err != nil {
		return err
	}
	// 2. The egress plumbing and the network namespace.
	if d.opts.Network != nil {
		if err := d.opts.Network.Unplumb(ctx, id); err != nil {
			return err
		}
	}
	if err := removeNetns(d.netnsPath(id)); err != nil {
		return err
	}
	// 3. The writable layer (and the bind of its /tmp that a crash during
	// a boot may have left). A mount namespace that a runsc process was
	// setting up while copying our mounts may hold the layer's image for
	// a moment (see drivers/internal/layer: ErrUnavailable); retry briefly.
	if err := layer.UnbindMountPoint(d.mountSource(id)); err != nil {
		return err
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = layer.Destroy(d.layerDir(id)); err == nil || !errdefs.IsUnavailable(err) {
			break
		}
		if serr := sleepCtx(ctx, 100*time.Millisecond); serr != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	// 4. Cgroups (runsc delete removes them; not after a failed start).
	if err := removeCgroup(cg); err != nil {
		return err
	}
	// 5. The directory, once nothing is mounted below it.
	if m := mountsUnder(d.dir(id)); len(m) > 0 {
		return errdefs.Unavailablef("sandbox %s: still mounted: %v", id, m)
	}
	if err := os.RemoveAll(d.dir(id)); err != nil {
		return err
	}
	return nil
}

// waitCgroupEmpty waits until cgroup path has no process.
func waitCgroupEmpty(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(cgroupProcs(path)) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes remain", path)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
