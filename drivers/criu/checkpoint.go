package criu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
	"github.com/amber-run/amber/drivers/internal/writebehind"
)

var _ sandbox.Checkpointer = (*Driver)(nil)

// criuOpts are the CRIU options of both directions.
func criuOpts(images, work string) *libcontainer.CriuOpts {
	return &libcontainer.CriuOpts{
		ImagesDirectory:   images,
		WorkDirectory:     work,
		TcpEstablished:    true,
		FileLocks:         true,
		ManageCgroupsMode: "soft",
		StatusFd:          -1,
	}
}

// withCriuPath makes libcontainer's "criu" (looked up in PATH) the driver's
// CriuPath, by putting its directory first in PATH when it is not found
// there already.
func (d *Driver) withCriuPath() error {
	want, err := filepath.EvalSymlinks(d.opts.CriuPath)
	if err != nil {
		return errdefs.FailedPreconditionf("criu driver: CRIU not found at %s: %s", d.opts.CriuPath, setupHint)
	}
	if p, err := exec.LookPath("criu"); err == nil {
		if got, err := filepath.EvalSymlinks(p); err == nil && got == want {
			return nil
		}
	}
	return os.Setenv("PATH", filepath.Dir(d.opts.CriuPath)+":"+os.Getenv("PATH"))
}

// freezeAttempts is how many times a checkpoint tries to freeze its
// sandbox before it fails.
const freezeAttempts = 4

// Checkpoint implements sandbox.Checkpointer.
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, opts sandbox.CheckpointOptions) (stats sandbox.CheckpointStats, err error) {
	start := time.Now()
	if err := validID(id); err != nil {
		return stats, err
	}
	if err := d.withCriuPath(); err != nil {
		return stats, err
	}
	unlock := d.lock(id)
	defer unlock()
	ls, err := d.container(id)
	if err != nil {
		return stats, err
	}
	if st, err := ls.c.Status(); err != nil {
		return stats, recordErr(id, err)
	} else if st == libcontainer.Paused && d.thawLeftoverLocked(id, ls) {
		// A dead daemon's cut left it frozen (the lock is ours: no cut
		// of this process is under way); thawed, it is cut as any other.
	} else if st != libcontainer.Running {
		return stats, errdefs.FailedPreconditionf("sandbox %s is %s", id, st)
	}
	// Pages still only in the image of a lazy restore would be missed.
	if err := waitLazy(ctx, id, ls); err != nil {
		return stats, err
	}
	rec := ls.rec
	l, err := layer.Open(d.layerDir(id))
	if err != nil {
		return stats, recordErr(id, err)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return stats, err
	}
	criuDir := filepath.Join(imageDir, imageCriuDir)
	if err := os.RemoveAll(criuDir); err != nil {
		return stats, err
	}
	work := filepath.Join(d.recordDir(id), "criu-work")
	if err := os.RemoveAll(work); err != nil {
		return stats, err
	}
	cm, err := manager.New(ls.c.Config().Cgroups)
	if err != nil {
		return stats, recordErr(id, err)
	}
	initPid := 0
	if s, err := ls.c.State(); err == nil {
		initPid = s.InitProcessPid
	}
	if rec.hasAgent() {
		defer d.quiesceAgent(ctx, id, initPid)()
	}

	// A stopped or traced task makes CRIU's seize wait forever under the
	// frozen cgroup (measured: criu dump in D state for as long as one
	// waits, the sandbox frozen): refused before anything is frozen.
	if err := stoppedTasks(cm); err != nil {
		return stats, errdefs.FailedPreconditionf("checkpoint %s: %v; the sandbox keeps running", id, err)
	}

	frozenAt, err := freezeSeizable(ctx, d, cm, id)
	if err != nil {
		return stats, err
	}
	// The egress link is away while the sandbox is frozen (network.go).
	link, lerr := d.unlinkForDump(ctx, id, initPid)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			link.restore()
			if err := cm.Freeze(cgroups.Thawed); err != nil {
				d.log.Error("thaw after checkpoint", "sandbox", id, "err", err)
			}
			stats.Frozen = time.Since(frozenAt)
		}
	}
	defer thaw()
	if lerr != nil {
		return stats, recordErr(id, lerr)
	}
	netns, err := readNetnsForDump(initPid)
	if err != nil {
		return stats, recordErr(id, err)
	}
	conns := countTCPEstablished(initPid)
	starts := map[int]uint64{}
	if procs, err := d.Processes(ctx, id); err == nil {
		for _, p := range procs {
			starts[p.PID] = p.StartTicks
		}
	}
	ao := d.archiveOptions(rec)
	ao.BlobCache = d.blobCacheDir(id)
	lc, err := layer.CutArchiveFile(filepath.Join(imageDir, imageLayerName), l.Upper(), ao)
	if err != nil {
		return stats, recordErr(id, fmt.Errorf("archive layer: %w", err))
	}
	defer lc.Abort() // after Commit, nothing; the layer's bytes count its blobs:
	files, layerBytes := lc.Entries, lc.Size+lc.BlobBytes
	layerTook := time.Since(frozenAt)
	// CRIU finds the cgroup frozen and leaves it frozen. LeaveStopped is
	// not CRIU's kill-after-dump: the driver kills the frozen tree itself,
	// as Kill does, so that no task outlives the cut.
	co := criuOpts(criuDir, work)
	co.LeaveRunning = true
	co.EmptyNs = netns.emptyNs()
	// The disk writes the images while CRIU dumps them, so the fsync of
	// the image (a strict tool call's acknowledgement waits for it) has
	// little left (writebehind).
	wb := writebehind.Dir(criuDir, writebehind.Interval)
	err = d.dumpWithin(ctx, ls, co, cm)
	wb.Stop()
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(work, "dump.log"))
		if errdefs.IsUnavailable(err) {
			return stats, recordErr(id, err)
		}
		if bytes.Contains(b, []byte("fsnotify: \tCan't dump that handle")) {
			return stats, errdefs.FailedPreconditionf("checkpoint %s: a process of the sandbox watches (inotify) a path outside %s, which CRIU cannot find on the sandbox's overlay; watch under one of those, or stop the watch, and checkpoint again (the sandbox keeps running)", id, strings.Join(irmapScanPaths, " "))
		}
		return stats, recordErr(id, fmt.Errorf("criu dump: %w (dump.log: %s)", err, lastLines(b, 15)))
	}
	if opts.LeaveStopped {
		err := d.killAll(ctx, ls.c)
		thawed = true // killAll thaws
		stats.Frozen = time.Since(frozenAt)
		if err != nil {
			return stats, recordErr(id, err)
		}
	}
	thaw()
	// The new blob cache files are fsynced now, the sandbox running.
	if err := lc.Commit(); err != nil {
		return stats, recordErr(id, fmt.Errorf("archive layer: %w", err))
	}
	mem := pagesBytes(criuDir)
	if err := d.writeImageMeta(ctx, imageDir, rec, frozenAt, conns, files, mem, starts, netns); err != nil {
		return stats, err
	}
	stats.MemoryBytes = mem
	stats.LayerBytes = layerBytes
	stats.Total = time.Since(start)
	d.log.Info("sandbox checkpointed", "sandbox", id, "frozen", stats.Frozen, "total", stats.Total, "memory_bytes", mem, "layer_bytes", layerBytes,
		"frozen_to_layer", layerTook, "blobs_reused", lc.Reused, "blobs_copied", lc.Copied)
	return stats, nil
}

// pagesBytes is the size of CRIU's memory pages in dir.
func pagesBytes(dir string) int64 {
	m, _ := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	var n int64
	for _, p := range m {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// countTCPEstablished counts established TCP sockets in pid's network
// namespace (0 when unknown).
func countTCPEstablished(pid int) int {
	if pid <= 0 {
		return 0
	}
	n := 0
	for _, f := range []string{"tcp", "tcp6"} {
		file, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			if fl := strings.Fields(sc.Text()); len(fl) > 3 && fl[3] == "01" {
				n++
			}
		}
		file.Close()
	}
	return n
}

// restoreLosses compares the cut (meta) with the restored sandbox: the
// processes of the cut missing after the restore (by sandbox PID, the
// agent left out on both sides) and the TCP connections reset.
func restoreLosses(meta *imageMeta, after []sandbox.Process, procErr error, reset int) []sandbox.Loss {
	var out []sandbox.Loss
	if procErr != nil {
		out = append(out, sandbox.Loss{Kind: sandbox.LossUnverified, Detail: "processes: " + procErr.Error()})
	} else {
		present := make(map[int]bool, len(after))
		for _, p := range after {
			present[p.PID] = true
		}
		var missing []int
		for pid := range meta.StartTicks {
			if !present[pid] {
				missing = append(missing, pid)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			out = append(out, sandbox.Loss{Kind: sandbox.LossProcesses, Count: len(missing),
				Detail: fmt.Sprintf("sandbox PIDs %v of the cut are not running after the restore", missing)})
		}
	}
	if reset > 0 {
		out = append(out, sandbox.Loss{Kind: sandbox.LossConnections, Count: reset,
			Detail: fmt.Sprintf("%d of %d established at the cut did not come back established", reset, meta.Connections)})
	}
	return out
}

// restoreTemplate is the template a restore of meta as spec uses: the
// image's, with the rootfs spec gives (of the same version) if any.
func restoreTemplate(spec sandbox.Spec, meta *imageMeta) (sandbox.Template, error) {
	tmpl := meta.Template
	if spec.Template.RootFS != "" {
		if spec.Template.Version != "" && meta.Template.Version != "" && spec.Template.Version != meta.Template.Version {
			return tmpl, errdefs.FailedPreconditionf("sandbox %s: image was cut from template %s version %s, not %s", spec.ID, meta.Template.Name, meta.Template.Version, spec.Template.Version)
		}
		tmpl.RootFS = spec.Template.RootFS
	}
	if fi, err := os.Stat(tmpl.RootFS); err != nil || !fi.IsDir() {
		return tmpl, errdefs.FailedPreconditionf("sandbox %s: template %s rootfs %s: not a directory", spec.ID, tmpl.Name, tmpl.RootFS)
	}
	return tmpl, nil
}

// Restore implements sandbox.Checkpointer.
func (d *Driver) Restore(ctx context.Context, spec sandbox.Spec, imageDir string, opts sandbox.RestoreOptions) (stats sandbox.RestoreStats, err error) {
	start := time.Now()
	if err := validID(spec.ID); err != nil {
		return stats, err
	}
	if !seccompSupported {
		return stats, d.Check(ctx)
	}
	if err := d.withCriuPath(); err != nil {
		return stats, err
	}
	meta, err := readImageMeta(imageDir)
	if err != nil {
		return stats, err
	}
	tmpl, err := restoreTemplate(spec, meta)
	if err != nil {
		return stats, err
	}
	// A restore under the image's own id goes back into the image's uid
	// range; a fork (another id) gets a free range of its own (fork.go).
	forked := meta.ID != "" && spec.ID != meta.ID
	slot := -1
	if !forked {
		if slot, err = d.slotOf(meta.HostID); err != nil {
			return stats, recordErr(spec.ID, err)
		}
	}

	rec, agentBin, err := d.restoredRecord(spec.ID, meta, tmpl, slot, imageDir)
	if err != nil {
		return stats, err
	}

	unlock := d.lock(spec.ID)
	defer unlock()

	// A stopped sandbox of that id is replaced (its egress plumbing kept:
	// the restored sockets find the gateway's ends); a running one is
	// refused.
	if err := d.clearForRestore(ctx, spec.ID); err != nil {
		return stats, err
	}

	if err := d.claimForRestore(rec, forked); err != nil {
		return stats, recordErr(spec.ID, err)
	}
	defer func() {
		if err != nil {
			if derr := d.destroyLocked(context.WithoutCancel(ctx), spec.ID); derr != nil {
				d.log.Error("cleanup after failed restore", "sandbox", spec.ID, "err", derr)
			}
		}
	}()

	rootfs, files, err := d.restoreRootfs(rec, filepath.Join(imageDir, imageLayerName))
	if err != nil {
		return stats, recordErr(spec.ID, fmt.Errorf("restore layer: %w", err))
	}
	criuImages, criuDir, err := d.criuImagesFor(rec, imageDir, meta.HostID, forked)
	if err != nil {
		return stats, recordErr(spec.ID, err)
	}
	if err := layer.CheckMountPoints(rootfs, rootMountPoints...); err != nil {
		return stats, recordErr(spec.ID, err)
	}
	cfg := d.containerConfig(rec, rootfs, agentBin)
	cfg.Hooks = meta.Netns.setupHook()
	c, err := libcontainer.Create(d.runc, spec.ID, cfg)
	if err != nil {
		return stats, recordErr(spec.ID, fmt.Errorf("libcontainer create: %w", err))
	}
	work := filepath.Join(d.recordDir(spec.ID), "criu-work")
	co := criuOpts(criuDir, work)
	co.EmptyNs = meta.Netns.emptyNs()
	var lazy *lazyLoad
	if opts.Lazy && d.Capabilities().LazyRestore {
		if lazy, err = d.startLazyPages(criuDir, work, forked, criuImages); err != nil {
			return stats, recordErr(spec.ID, err)
		}
		// A restore that fails from here on leaves no lazy-pages behind.
		defer func() {
			if err != nil {
				lazy.stop()
			}
		}()
		co.LazyPages = true
		stats.Lazy = true
	}
	p := &libcontainer.Process{Init: true}
	if err := c.Restore(p, co); err != nil {
		b, _ := os.ReadFile(filepath.Join(work, "restore.log"))
		return stats, recordErr(spec.ID, fmt.Errorf("criu restore: %w (restore.log: %s)", err, lastLines(b, 15)))
	}
	go func() { _, _ = p.Wait() }()
	initPid, _ := p.Pid()
	if err := d.plumb(ctx, spec.ID, initPid); err != nil {
		return stats, recordErr(spec.ID, err)
	}
	stats.Running = time.Since(start)
	lazy.restored()
	// libcontainer's Container stays in its "restored" state after
	// Restore and reports Running even once every process is gone; a
	// loaded one tracks the real state.
	if lc, err := libcontainer.Load(d.runc, spec.ID); err == nil {
		c = lc
	} else {
		return stats, recordErr(spec.ID, fmt.Errorf("load restored container: %w", err))
	}

	ls := &liveSandbox{c: c, rec: rec, lazy: lazy}
	stats.Loaded = d.watchLazy(spec.ID, ls)
	d.noteRestoredStarts(ls, rec, meta.StartTicks)
	rec.Phase = phaseCreated
	if err := d.saveRecord(rec); err != nil {
		return stats, recordErr(spec.ID, err)
	}
	d.mu.Lock()
	d.live[spec.ID] = ls
	d.mu.Unlock()
	if rec.hasAgent() {
		// The client's connections went with the killed sandbox's
		// namespace; its streams re-attach by offset to the restored
		// agent, whose rings are as of the cut.
		d.dropAgent(spec.ID, false)
		if err := d.waitAgent(ctx, ls); err != nil {
			return stats, err
		}
	}

	if pids, err := c.Processes(); err == nil {
		stats.Processes = len(pids)
	}
	stats.MemoryBytes = pagesBytes(criuDir)
	if forked && lazy == nil {
		// CRIU is done with the private copy (a lazy restore's page
		// server reads it until the load ends: watchLazy removes it then).
		if err := os.RemoveAll(criuImages); err != nil {
			d.log.Warn("remove a fork's copy of the image", "sandbox", spec.ID, "err", err)
		}
	}
	stats.Files = files
	d.noteOutcome(ctx, spec.ID, meta, initPid, &stats)
	d.log.Info("sandbox restored", "sandbox", spec.ID, "running", stats.Running, "processes", stats.Processes, "memory_bytes", stats.MemoryBytes)
	return stats, nil
}

// noteOutcome fills stats with what of the cut meta came back in restored
// sandbox id (init initPid): connections and processes.
func (d *Driver) noteOutcome(ctx context.Context, id string, meta *imageMeta, initPid int, stats *sandbox.RestoreStats) {
	stats.ConnectionsRestored = countTCPEstablished(initPid)
	if meta.Connections > stats.ConnectionsRestored {
		stats.ConnectionsReset = meta.Connections - stats.ConnectionsRestored
	}
	procs, perr := d.Processes(ctx, id)
	stats.NotRestored = restoreLosses(meta, procs, perr, stats.ConnectionsReset)
}

// restoredRecord is the record of sandbox id restored from meta, and the
// agent binary to bind (empty for an image made before the agent). The
// restored agent runs the build it had mapped at the cut: this node must
// have it (FailedPrecondition, before anything is touched).
func (d *Driver) restoredRecord(id string, meta *imageMeta, tmpl sandbox.Template, slot int, imageDir string) (*record, string, error) {
	rec := &record{
		Version:    recordVersion,
		ID:         id,
		Tenant:     meta.Tenant,
		Template:   tmpl,
		Limits:     meta.Limits,
		Env:        meta.Env,
		Created:    meta.Created,
		Phase:      phaseCreating,
		Slot:       slot,
		HostID:     meta.HostID,
		Init:       meta.Init,
		AgentBuild: meta.AgentBuild,
		AgentToken: meta.AgentToken,
	}
	if meta.Init != "" && !rec.hasAgent() {
		return nil, "", errdefs.InvalidArgumentf("checkpoint image %s: init %q unknown to this driver", imageDir, meta.Init)
	}
	if rec.hasAgent() && (rec.AgentBuild == "" || rec.AgentToken == "") {
		return nil, "", errdefs.DataLossf("checkpoint image %s: agent init without its build or token", imageDir)
	}
	agentBin, err := d.agentBinary(rec)
	if err != nil {
		return nil, "", err
	}
	return rec, agentBin, nil
}

// clearForRestore makes way for a restore of id (d holds its lock): a
// stopped sandbox of that id, or a runtime state directory left without a
// record, is destroyed, all but its egress plumbing (network.go); a
// running sandbox is FailedPrecondition.
func (d *Driver) clearForRestore(ctx context.Context, id string) error {
	if _, err := d.loadRecord(id); err == nil || !errdefs.IsNotFound(err) {
		if ls, err := d.container(id); err == nil {
			if st, err := ls.c.Status(); err == nil && st != libcontainer.Stopped {
				return errdefs.FailedPreconditionf("sandbox %s is %s; kill it before restoring over it", id, st)
			}
		}
		if err := d.destroySandbox(ctx, id, true); err != nil {
			return err
		}
	} else if _, serr := os.Lstat(filepath.Join(d.runc, id)); serr == nil {
		if err := d.destroySandbox(ctx, id, true); err != nil {
			return err
		}
	}
	return nil
}

// noteRestoredStarts records in rec, for each process of the restored
// sandbox ls, its host start time beside the start time it had when cut
// (startTicks, the image's), so the processes keep their start times.
func (d *Driver) noteRestoredStarts(ls *liveSandbox, rec *record, startTicks map[int]uint64) {
	if toHost, _, err := d.sandboxPids(ls); err == nil {
		rec.Restored = map[int]restoredStart{}
		for sp, hp := range toHost {
			orig, ok := startTicks[sp]
			if st, err := readStat(hp); ok && err == nil {
				rec.Restored[sp] = restoredStart{HostTicks: st.startTicks, Ticks: orig}
			}
		}
	}
}

// claimSlotN claims uid range n for id.
func (d *Driver) claimSlotN(id string, n int) error {
	f, err := os.OpenFile(d.slotPath(n), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		owner, _ := os.ReadFile(d.slotPath(n))
		return errdefs.FailedPreconditionf("uid range %d (of the image) is held by sandbox %s", n, owner)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(id)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(d.slotPath(n))
	}
	return err
}

// restoreRootfs makes a fresh layer for rec, unpacks the archived upper
// directory into it while the overlay is not mounted, mounts the overlay
// and binds it at rootfsPath.
func (d *Driver) restoreRootfs(rec *record, tarPath string) (string, int, error) {
	var l *layer.Layer
	err := withIdmappedTemplate(rec, func(lower string) error {
		var err error
		l, err = layer.Create(d.layerDir(rec.ID), lower, rec.Limits.DiskBytes)
		return err
	})
	if err != nil {
		return "", 0, err
	}
	if err := unix.Unmount(l.Merged(), 0); err != nil {
		return "", 0, fmt.Errorf("unmount fresh overlay: %w", err)
	}
	// A blob cache describes the files a layer had (their inodes): the
	// extraction seeds a new one with the restored files' blobs.
	if err := os.RemoveAll(d.blobCacheDir(rec.ID)); err != nil {
		return "", 0, fmt.Errorf("clear blob cache: %w", err)
	}
	ao := d.archiveOptions(rec)
	ao.BlobCache = d.blobCacheDir(rec.ID)
	files, err := layer.ExtractArchiveFile(tarPath, l.Upper(), ao)
	if err != nil {
		return "", 0, err
	}
	err = withIdmappedTemplate(rec, func(lower string) error {
		var err error
		l, err = layer.Open(d.layerDir(rec.ID), layer.WithLower(lower))
		return err
	})
	if err != nil {
		return "", 0, err
	}
	root, err := d.bindRootfs(rec.ID, l.Merged())
	return root, files, err
}

// prepareImages makes CRIU's images readable by the restored tasks. They
// read them from inside the sandbox's user namespace, some (timens-*.img)
// before CRIU has written the namespace's uid map, when sandbox root is not
// yet the owner HostID: so the images are owned by HostID and readable by
// all, while the image directory itself stays private to root (0700) —
// CRIU reaches the images through a descriptor, not through the path.
func prepareImages(imageDir, criuDir string, id int) error {
	if err := os.Chmod(imageDir, 0o700); err != nil {
		return err
	}
	return filepath.WalkDir(criuDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, id, id); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if de.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	})
}

// archiveOptions are rec's layer archive's: owners relative to its uid
// range (drivers/internal/layer's archive, read and written by descriptor).
func (d *Driver) archiveOptions(rec *record) layer.ArchiveOptions {
	return layer.ArchiveOptions{IDs: layer.IDMap{Host: rec.HostID, Size: idsPerSandbox}, Failpoints: d.opts.Failpoints}
}

// freezeRetrying freezes cm, the cut. The v1 freezer gives up ("unable to
// freeze") when a task keeps it FREEZING past libcontainer's retries — seen
// on a loaded host: thaw, and try again a few times before failing the
// checkpoint. It returns when the freeze took hold.
func freezeRetrying(ctx context.Context, d *Driver, cm cgroups.Manager, id string) (time.Time, error) {
	frozenAt := time.Now()
	for attempt := 1; ; attempt++ {
		err := cm.Freeze(cgroups.Frozen)
		if err == nil {
			return frozenAt, nil
		}
		if attempt == freezeAttempts {
			return frozenAt, recordErr(id, fmt.Errorf("freeze (%d attempts): %w", attempt, err))
		}
		d.log.Warn("freeze failed; thawing and trying again", "sandbox", id, "attempt", attempt, "err", err)
		if terr := cm.Freeze(cgroups.Thawed); terr != nil {
			return frozenAt, recordErr(id, fmt.Errorf("freeze: %v; thaw: %w", err, terr))
		}
		select {
		case <-ctx.Done():
			return frozenAt, ctx.Err()
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
		frozenAt = time.Now()
	}
}
