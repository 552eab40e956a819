package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
	"github.com/amber-run/amber/drivers/internal/writebehind"
	"github.com/amber-run/amber/lib/agentproto"
)

var _ sandbox.Checkpointer = (*Driver)(nil)

// imageVersion is the format of image.json (and of the image directory's
// layout). Bump it when either changes meaning. 2: layer.tar references
// blobs in layer-blobs/; an image without blobs is written as 1, which
// binaries from before blobs read (they would restore a blob as an empty
// file, and refuse a 2).
const imageVersion, imageVersionNoBlobs = 2, 1

// Names inside an image directory:
//
//	image.json   imageMeta: what Restore needs besides the template
//	layer.tar    the writable layer's upper directory, uncompressed (modes,
//	             owners, times, symlinks, hard links, whiteouts as 0/0
//	             character devices, xattrs such as trusted.overlay.opaque;
//	             owners as host ids): drivers/internal/layer's archive
//	layer-blobs/ the layer's files of 1 MiB or more, which layer.tar
//	             references: links into blobCacheDir (layer's blobs.go)
//	runsc/       `runsc checkpoint --compression=none` output (kernel state
//	             and memory pages)
const (
	imageMetaName  = "image.json"
	imageLayerName = "layer.tar"
	imageRunscDir  = "runsc"
)

// imageMeta is <imageDir>/image.json.
type imageMeta struct {
	Version      int      `json:"version"`
	Driver       string   `json:"driver"`
	RunscVersion string   `json:"runsc_version"`
	RunscFlags   []string `json:"runsc_flags"`
	SpecVersion  int      `json:"spec_version,omitempty"` // record.SpecVersion
	// AgentBuild and AgentToken (spec generation 2 on) are the record's:
	// the restored init is the agent of that build, which holds that
	// token in its memory. The token is why image.json is 0600.
	AgentBuild string           `json:"agent_build,omitempty"`
	AgentToken string           `json:"agent_token,omitempty"`
	ID         string           `json:"id"`
	Tenant     string           `json:"tenant,omitempty"`
	Template   sandbox.Template `json:"template"`
	Limits     sandbox.Limits   `json:"limits"`
	Env        []string         `json:"env,omitempty"`
	Cwd        string           `json:"cwd"`
	UID        uint32           `json:"uid"`
	GID        uint32           `json:"gid"`
	// SandboxCreated is when the sandbox was first created; Taken when
	// this cut was made.
	SandboxCreated time.Time `json:"sandbox_created"`
	Taken          time.Time `json:"taken"`
	LayerBytes     int64     `json:"layer_bytes"`
	LayerEntries   int       `json:"layer_entries"`
	MemoryBytes    int64     `json:"memory_bytes"`
}

// Checkpoint implements sandbox.Checkpointer.
//
// The cut, by calls on the sandbox's control socket (control.go; what
// `runsc pause`, `runsc checkpoint` and `runsc resume` would send, without
// a runsc process): Pause stops every task of the sandbox (the sentry
// stops its kernel; nothing inside runs, so nothing writes to the layer);
// the layer's upper directory is archived to layer.tar (layer.WriteArchive:
// by descriptor, never following a name the tenant controls); Checkpoint
// writes the kernel and memory image uncompressed (and leaves the sandbox
// running, unless opts.LeaveStopped); Resume. Memory and
// files therefore describe the same frozen moment. Writes of the sandbox
// reach the host before the pause completes: the root is a gofer mount
// with --overlay2=none, whose writes go through to the host file
// (--file-access=shared keeps no dirty data in the sentry).
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, opts sandbox.CheckpointOptions) (_ sandbox.CheckpointStats, err error) {
	var stats sandbox.CheckpointStats
	start := time.Now()
	if err := validID(id); err != nil {
		return stats, errdefs.NotFoundf("sandbox %s", id)
	}
	if !filepath.IsAbs(imageDir) {
		return stats, errdefs.InvalidArgumentf("checkpoint %s: image dir %q is not absolute", id, imageDir)
	}
	unlock := d.lock(id)
	defer unlock()
	rec, err := d.running(id)
	if err != nil {
		return stats, err
	}
	if err := d.waitLoad(ctx, id); err != nil { // a lazy restore's pages first (lazy.go)
		return stats, err
	}
	l, err := layer.Open(d.layerDir(id))
	if err != nil {
		return stats, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	runscDir, err := newImageDir(id, imageDir)
	if err != nil {
		return stats, err
	}

	if rec.SpecVersion >= 2 {
		// No agent connection may be open at the cut (holdAgentDials);
		// streams re-attach once the dials are let through again,
		// after the resume below (defers run last first).
		letDial, err := d.holdAgentDials(ctx, id)
		if err != nil {
			return stats, fmt.Errorf("checkpoint %s: %w", id, err)
		}
		defer letDial()
	}
	// Freeze (marked first: leftover.go). A mark found here, under the
	// lock, is a dead daemon's cut.
	if err := d.stopLeftPausedLocked(id); err != nil {
		return stats, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if err := d.markCut(id); err != nil {
		return stats, err
	}
	if err := d.control(ctx, id, ctlPause, nil); err != nil {
		if controlDown(err) {
			st, _, serr := d.state(ctx, rec, id)
			return stats, errors.Join(errdefs.FailedPreconditionf("checkpoint %s: sandbox is not running (runsc: %q): %v", id, st.Status, err), serr)
		}
		return stats, fmt.Errorf("checkpoint %s: pause: %w", id, err)
	}
	frozen := time.Now()
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		if opts.LeaveStopped {
			stats.Frozen = time.Since(frozen)
			return d.stopPaused(rec)
		}
		err := d.control(context.Background(), id, ctlResume, nil)
		stats.Frozen = time.Since(frozen)
		if err != nil {
			return fmt.Errorf("checkpoint %s: resume: %w", id, err) // the mark stays: it may be paused
		}
		d.clearCut(id)
		return nil
	}
	defer func() {
		// Never leave a sandbox frozen because a step failed.
		if rerr := resume(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()

	// The layer, as of the frozen moment.
	lc, err := layer.CutArchiveFile(filepath.Join(imageDir, imageLayerName), l.Upper(), layer.ArchiveOptions{Failpoints: d.opts.Failpoints, BlobCache: d.blobCacheDir(id)})
	if err != nil {
		return stats, fmt.Errorf("checkpoint %s: layer: %w", id, err)
	}
	defer lc.Abort() // after Commit, nothing; the layer's bytes count its blobs:
	entries, layerBytes := lc.Entries, lc.Size+lc.BlobBytes
	tLayer := time.Now()
	// Memory and kernel state.
	if err := d.saveKernelRetried(ctx, id, runscDir, !opts.LeaveStopped); err != nil {
		return stats, err
	}
	tImage := time.Now()
	if err := resume(); err != nil {
		return stats, err
	}
	d.log.Debug("checkpoint: steps", "sandbox", id, "pause", frozen.Sub(start), "layer", tLayer.Sub(frozen), "runsc_checkpoint", tImage.Sub(tLayer), "resume", time.Since(tImage), "blobs_reused", lc.Reused, "blobs_copied", lc.Copied)
	if err := lc.Commit(); err != nil { // new blob cache files fsynced, the sandbox running
		return stats, fmt.Errorf("checkpoint %s: layer: %w", id, err)
	}

	mem, err := dirSize(runscDir)
	if err != nil {
		return stats, err
	}
	meta := imageMeta{
		Version:        imageVersionNoBlobs + min(lc.Reused+lc.Copied, 1),
		Driver:         "gvisor",
		RunscVersion:   rec.RunscVersion,
		RunscFlags:     rec.RunscFlags,
		SpecVersion:    rec.SpecVersion,
		AgentBuild:     rec.AgentBuild,
		AgentToken:     rec.AgentToken,
		ID:             id,
		Tenant:         rec.Tenant,
		Template:       rec.Template,
		Limits:         rec.Limits,
		Env:            rec.Env,
		Cwd:            rec.Cwd,
		UID:            rec.UID,
		GID:            rec.GID,
		SandboxCreated: rec.Created,
		Taken:          frozen.UTC(),
		LayerBytes:     layerBytes,
		LayerEntries:   entries,
		MemoryBytes:    mem,
	}
	if meta.RunscVersion == "" {
		meta.RunscVersion = PinnedVersion
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return stats, err
	}
	if err := syncTree(imageDir); err != nil {
		return stats, err
	}
	if err := writeFileAtomic(filepath.Join(imageDir, imageMetaName), b, 0o600); err != nil {
		return stats, err
	}
	stats.Total = time.Since(start)
	stats.MemoryBytes = mem
	stats.LayerBytes = layerBytes
	d.log.Info("sandbox checkpointed", "sandbox", id, "frozen", stats.Frozen, "total", stats.Total, "memory_bytes", mem, "layer_bytes", layerBytes)
	return stats, nil
}

// newImageDir makes imageDir (it must be missing or empty) and its runsc/
// directory, which it returns.
func newImageDir(id, imageDir string) (string, error) {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return "", err
	}
	if ents, err := os.ReadDir(imageDir); err != nil {
		return "", err
	} else if len(ents) > 0 {
		return "", errdefs.AlreadyExistsf("checkpoint %s: image dir %s is not empty", id, imageDir)
	}
	runscDir := filepath.Join(imageDir, imageRunscDir)
	return runscDir, os.Mkdir(runscDir, 0o700)
}

// restoreOnce is one attempt of Restore (restoreagain.go), waiting
// agentWait for the restored agent.
//
// A sandbox with spec.ID that exists here must be stopped: its runtime
// container is deleted and its layer's content replaced by the image's. On
// a state directory that never saw the sandbox, the layer is created from
// the template first. The network namespace and the bundle are made as
// Create makes them, with the runsc flags, limits and environment of the
// image; then `runsc restore --detach`. The image's runsc version and the
// template's name and version must be this driver's and spec's.
func (d *Driver) restoreOnce(ctx context.Context, spec sandbox.Spec, imageDir string, opts sandbox.RestoreOptions, agentWait time.Duration) (_ sandbox.RestoreStats, err error) {
	var stats sandbox.RestoreStats
	start := time.Now()
	id := spec.ID
	if err := validID(id); err != nil {
		return stats, err
	}
	meta, err := readImageMeta(imageDir)
	if err != nil {
		return stats, err
	}
	if meta.RunscVersion != PinnedVersion {
		return stats, errdefs.FailedPreconditionf("restore %s: image was made by runsc %s, this driver runs %s", id, meta.RunscVersion, PinnedVersion)
	}
	if spec.Template.Name != meta.Template.Name || spec.Template.Version != meta.Template.Version {
		return stats, errdefs.FailedPreconditionf("restore %s: image was made from template %s@%s, not %s@%s", id, meta.Template.Name, meta.Template.Version, spec.Template.Name, spec.Template.Version)
	}
	rootfs := spec.Template.RootFS
	if rootfs == "" {
		rootfs = meta.Template.RootFS
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() || !filepath.IsAbs(rootfs) {
		return stats, errdefs.InvalidArgumentf("restore %s: template rootfs %q is not an absolute path of a directory", id, rootfs)
	}
	unlock := d.lock(id)
	defer unlock()
	tmpl := meta.Template
	tmpl.RootFS = rootfs
	rec := &record{
		Version:      recordVersion,
		ID:           id,
		Tenant:       meta.Tenant,
		Template:     tmpl,
		Limits:       meta.Limits,
		Env:          meta.Env,
		Cwd:          meta.Cwd,
		UID:          meta.UID,
		GID:          meta.GID,
		RunscFlags:   append([]string(nil), meta.RunscFlags...),
		RunscVersion: meta.RunscVersion,
		SpecVersion:  meta.SpecVersion,
		AgentBuild:   meta.AgentBuild,
		AgentToken:   meta.AgentToken,
		Cgroup:       d.cgroupPath(id),
		Netns:        d.netnsPath(id),
		Created:      meta.SandboxCreated,
		Phase:        phaseCreating,
	}
	if err := d.checkImageAgent(rec, imageDir); err != nil {
		return stats, err
	}
	// Connections into the sandbox's old life are stale.
	d.dropAgent(id)
	var l *layer.Layer
	old, err := d.loadRecord(id)
	switch {
	case err == nil:
		// Replace a stopped sandbox.
		if l, err = d.replaceStopped(ctx, old, rec, rootfs); err != nil {
			return stats, err
		}
	case errdefs.IsNotFound(err):
		if err := os.Mkdir(d.dir(id), 0o700); err != nil {
			if errors.Is(err, os.ErrExist) {
				return stats, errdefs.AlreadyExistsf("sandbox %s (half-created; destroy it)", id)
			}
			return stats, err
		}
		defer func() {
			if err != nil {
				dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if derr := d.destroy(dctx, id); derr != nil {
					d.log.Warn("cleanup after failed restore", "sandbox", id, "err", derr)
				}
			}
		}()
		if err := d.saveRecord(rec); err != nil {
			return stats, err
		}
		if l, err = layer.Create(d.layerDir(id), rootfs, rec.Limits.DiskBytes); err != nil {
			return stats, fmt.Errorf("restore %s: layer: %w", id, err)
		}
	default:
		return stats, err
	}

	tLayer := time.Now()
	entries, err := d.restoreLayerContent(ctx, id, l, imageDir)
	if err != nil {
		return stats, err
	}
	tNet := time.Now()
	if !isMountPoint(rec.Netns) {
		_ = removeNetns(rec.Netns)
		if err := createNetns(rec.Netns); err != nil {
			return stats, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	if d.opts.Network != nil {
		if err := d.opts.Network.Plumb(ctx, id, rec.Netns); err != nil {
			return stats, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	if err := d.writeBundle(rec, l.Merged()); err != nil {
		return stats, fmt.Errorf("restore %s: bundle: %w", id, err)
	}
	// Lazy: the sandbox runs while the sentry loads its memory (lazy.go).
	lazy := opts.Lazy
	tRunsc := time.Now()
	if err := d.withMountSources(rec, l.Merged(), func() error { return d.restoreRuntime(ctx, rec, filepath.Join(imageDir, imageRunscDir), lazy) }); err != nil {
		return stats, err
	}
	if rec.SpecVersion >= 2 {
		// The restored agent listens again; a new connection reaches
		// it (the old ones died with the old sandbox).
		d.dropAgent(id)
		if err := d.waitRestoredAgent(ctx, rec, agentWait); err != nil {
			return stats, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	tDone := time.Now()
	rec.Phase = phaseCreated
	if err := d.saveRecord(rec); err != nil {
		return stats, err
	}
	stats.Running = time.Since(start)
	stats.MemoryBytes = meta.MemoryBytes
	stats.Files = entries
	if stats.Lazy = lazy; lazy {
		stats.Loaded = d.watchLoad(id)
	}
	tStats := time.Now()
	if procs, conns, err := d.restoreStats(ctx, rec); err == nil {
		stats.Processes, stats.ConnectionsRestored = procs, conns
	} else {
		d.log.Warn("restore: cannot count processes and connections", "sandbox", id, "err", err)
		stats.NotRestored = append(stats.NotRestored, sandbox.Loss{Kind: sandbox.LossUnverified,
			Detail: "processes and connections: " + err.Error()})
	}
	// The phases, for the failover figures (docs/benchmarks.md): the old
	// copy's cleanup and the layer set up, the layer's content, the
	// network, runsc restore.
	d.log.Info("sandbox restored", "sandbox", id, "running", stats.Running, "processes", stats.Processes,
		"setup", tLayer.Sub(start).Round(time.Millisecond), "layer", tNet.Sub(tLayer).Round(time.Millisecond),
		"network", tRunsc.Sub(tNet).Round(time.Millisecond), "runsc", tDone.Sub(tRunsc).Round(time.Millisecond),
		"stats", time.Since(tStats).Round(time.Millisecond), "lazy", lazy)
	return stats, nil
}

// checkpointError explains a failed runsc checkpoint; the sandbox runs on
// after it. For the two known causes, which are the caller's to fix,
// runsc's message (an encoding error followed by a goroutine dump) is
// replaced by one line that says what to do:
//
//   - a port-forward connection (DialPort) open into the sandbox, whose
//     proxy in the sentry gVisor cannot save (waiter.ChannelNotifier);
//   - a FIFO (or another file that exists only in the sandbox's kernel)
//     held open after its path was deleted: gVisor saves deleted open
//     files only when the host has their data ("dead dentry is not saved
//     ... synthetic=true", gofer's dentry.beforeSave). The driver cannot
//     put the path back (the FIFO's buffer lives in the sentry), so the
//     checkpoint is refused naming the file, never taken without it.
func checkpointError(id string, err error) error {
	var (
		re   *runscError
		ce   *controlError
		full string
	)
	switch {
	case errors.As(err, &re):
		full = re.msg
	case errors.As(err, &ce):
		full = ce.msg
	default:
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	msg, _, _ := strings.Cut(full, "\n")
	msg = strings.TrimSuffix(msg, ":")
	switch {
	case strings.Contains(full, "waiter.ChannelNotifier"):
		return errdefs.FailedPreconditionf("checkpoint %s: a port-forward connection into the sandbox is open (DialPort), and gVisor cannot save it; close it and checkpoint again (runsc: %.300s)", id, msg)
	case strings.Contains(full, "dead dentry is not saved") && strings.Contains(full, "synthetic=true"):
		name := "a file"
		if _, rest, ok := strings.Cut(full, `dentry("`); ok {
			if n, _, ok := strings.Cut(rest, `")`); ok && len(n) <= 255 {
				name = strconv.Quote(n)
			}
		}
		return errdefs.FailedPreconditionf("checkpoint %s: a process holds open a FIFO named %s whose path was deleted; gVisor cannot save a deleted FIFO (its data lives only in the sandbox's kernel), so the sandbox runs on without a checkpoint; keep the FIFO's path until the process closes it, or use an anonymous pipe (criu checkpoints it)", id, name)
	}
	return fmt.Errorf("checkpoint %s: %w", id, err)
}

// checkImageAgent is asked before anything of a stopped sandbox is
// replaced: the agent the image's init has mapped must be on this node,
// and the image must hold its token.
func (d *Driver) checkImageAgent(rec *record, imageDir string) error {
	if rec.SpecVersion < 2 {
		return nil
	}
	if _, err := d.agentSource(rec); err != nil {
		return errdefs.FailedPreconditionf("restore %s: the image's init is amber-agent %s, which this node does not keep (%v); restore it on a node that ran that build, or add that binary to %s", rec.ID, rec.AgentBuild, err, filepath.Join(d.opts.StateDir, "agents"))
	}
	if rec.AgentToken == "" {
		return errdefs.DataLossf("restore %s: image %s names an agent but no token", rec.ID, imageDir)
	}
	return nil
}

// replaceStopped makes way for a restore over the stopped sandbox old (a
// sandbox still running is refused): its runtime container deleted, its
// cgroup emptied, its runtime state removed; then rec is saved and the
// sandbox's layer opened over rootfs.
func (d *Driver) replaceStopped(ctx context.Context, old, rec *record, rootfs string) (*layer.Layer, error) {
	id := rec.ID
	// A sandbox with no host process left does not run: runsc is not
	// asked (one process start fewer in every restore). With processes
	// left, runsc's status can lag behind a Kill that has just returned.
	if len(cgroupProcs(old.Cgroup)) > 0 {
		if err := d.waitStopped(ctx, old, id); err != nil {
			return nil, err
		}
	}
	if d.runtimeStateExists(id) {
		if _, err := d.run(ctx, old, "delete", "--force", runtimeID(id)); err != nil && !notExist(err) {
			d.log.Warn("restore: runsc delete failed; removing by hand", "sandbox", id, "err", err)
		}
	}
	if err := killCgroup(old.Cgroup, 10*time.Second); err != nil {
		return nil, err
	}
	if err := d.removeRuntimeState(id); err != nil {
		return nil, err
	}
	if err := d.saveRecord(rec); err != nil {
		return nil, err
	}
	l, err := layer.Open(d.layerDir(id), layer.WithLower(rootfs))
	if err != nil {
		return nil, fmt.Errorf("restore %s: layer: %w", id, err)
	}
	return l, nil
}

// waitStopped waits (2 s at most) until runsc says sandbox id is stopped,
// or knows it no more, or its cgroup holds no process.
func (d *Driver) waitStopped(ctx context.Context, old *record, id string) error {
	for deadline := time.Now().Add(2 * time.Second); ; {
		st, ok, err := d.state(ctx, old, id)
		if err != nil {
			return err
		}
		if !ok || st.Status == "stopped" || len(cgroupProcs(old.Cgroup)) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.FailedPreconditionf("restore %s: sandbox is %s; kill it first", id, st.Status)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// restoreLayerContent gives the layer l the image's content: it unmounts
// the overlay (never write into an overlay's upper directory while it is
// mounted), replaces upper with the image's layer archive, mounts again.
// It returns the archive's number of entries.
func (d *Driver) restoreLayerContent(ctx context.Context, id string, l *layer.Layer, imageDir string) (int, error) {
	if err := unmountRetry(ctx, l.Merged()); err != nil {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	if err := emptyDir(l.Upper()); err != nil {
		return 0, fmt.Errorf("restore %s: clear layer: %w", id, err)
	}
	if err := emptyDir(filepath.Join(filepath.Dir(l.Upper()), "work")); err != nil {
		return 0, fmt.Errorf("restore %s: clear layer: %w", id, err)
	}
	// The blob cache describes the old files' inodes: the extraction
	// seeds a new one with the restored files' blobs.
	if err := os.RemoveAll(d.blobCacheDir(id)); err != nil {
		return 0, fmt.Errorf("restore %s: clear blob cache: %w", id, err)
	}
	entries, err := layer.ExtractArchiveFile(filepath.Join(imageDir, imageLayerName), l.Upper(), layer.ArchiveOptions{Failpoints: d.opts.Failpoints, BlobCache: d.blobCacheDir(id)})
	if err != nil {
		return 0, fmt.Errorf("restore %s: layer: %w", id, err)
	}
	if err := l.Mount(); err != nil {
		return 0, fmt.Errorf("restore %s: layer: %w", id, err)
	}
	if err := prepareRoot(l.Merged()); err != nil {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	return entries, nil
}

// restoreRuntime runs `runsc restore --detach` of the image in runscDir
// with rec's bundle.
func (d *Driver) restoreRuntime(ctx context.Context, rec *record, runscDir string, background bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	logFile := filepath.Join(d.dir(rec.ID), "runsc.log")
	pidFile := filepath.Join(d.dir(rec.ID), "sandbox.pid")
	_ = os.Remove(logFile)
	_ = os.Remove(pidFile)
	args := append(d.globalFlags(rec, logFile), "restore", "--detach", "--image-path="+runscDir,
		"--pid-file="+pidFile, "--bundle="+d.bundleDir(rec.ID))
	if background {
		args = append(args, "--background")
	}
	args = append(args, runtimeID(rec.ID))
	// stdio /dev/null: the restored sandbox inherits it (see boot).
	if err := d.command(ctx, args...).Run(); err != nil {
		msg := strings.Join(logMessages(logFile), "; ")
		return fmt.Errorf("sandbox %s: runsc restore: %v: %s", rec.ID, err, msg)
	}
	return nil
}

// runLogged is run with a --log file whose messages the error quotes.
func (d *Driver) runLogged(ctx context.Context, rec *record, logFile string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := d.command(ctx, append(d.globalFlags(rec, logFile), args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.Join(logMessages(logFile), "; ")
		if msg == "" {
			msg = strings.TrimSpace(string(out))
		}
		return out, &runscError{args: args, err: err, msg: msg}
	}
	return out, nil
}

// statsScript prints the number of processes in the sandbox, counted
// before it starts any (so the count holds the script's shell, and no
// child of it), then /proc/net/tcp and tcp6. One exec with one child: the
// stats of a restore (a Processes listing costs two process starts per
// process, and each start is dear in a sandbox on a loaded host — it was
// 1.5–3 s of every failover restore on 2 cores).
const statsScript = `n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null`

// restoreStats counts the sandbox's processes and its established TCP
// connections: the agent's census, which starts no process, or, from an
// agent older than protocol 1.2 (restored from an older image), one exec
// of statsScript (its shell left out of the count).
func (d *Driver) restoreStats(ctx context.Context, rec *record) (procs, conns int, err error) {
	if rec.SpecVersion >= 2 {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second) // as the exec's below
		cs, err := d.agentFor(rec).Census(cctx)
		cancel()
		if err == nil {
			return cs.Processes, cs.TCPEstablished, nil
		}
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			return 0, 0, fmt.Errorf("count processes and connections: %w", err)
		}
	}
	var out strings.Builder
	st, err := d.exec(ctx, rec, sandbox.ExecSpec{
		Args:    []string{"/bin/sh", "-c", statsScript},
		Stdout:  &out,
		Timeout: 30 * time.Second,
	})
	if err != nil || st.Code != 0 {
		return 0, 0, fmt.Errorf("count processes and connections: %v %+v", err, st)
	}
	return parseStats(out.String())
}

// parseStats parses statsScript's output.
func parseStats(s string) (procs, conns int, err error) {
	first, rest, _ := strings.Cut(s, "\n")
	n, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || n < 1 {
		return 0, 0, fmt.Errorf("process count %q", first)
	}
	return n - 1, agentproto.CountEstablished(rest), nil
}

func readImageMeta(imageDir string) (*imageMeta, error) {
	b, err := os.ReadFile(filepath.Join(imageDir, imageMetaName))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFoundf("image %s: no %s", imageDir, imageMetaName)
		}
		return nil, err
	}
	var m imageMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errdefs.DataLossf("image %s: %s: %v", imageDir, imageMetaName, err)
	}
	if m.Version != imageVersion && m.Version != imageVersionNoBlobs {
		return nil, errdefs.FailedPreconditionf("image %s: format version %d, this driver reads %d", imageDir, m.Version, imageVersion)
	}
	if m.Driver != "gvisor" {
		return nil, errdefs.FailedPreconditionf("image %s was made by driver %q, not gvisor", imageDir, m.Driver)
	}
	return &m, nil
}

// unmountRetry unmounts path if it is mounted, retrying while it is busy
// (a runsc process that was copying our mounts may hold it a moment).
func unmountRetry(ctx context.Context, path string) error {
	var err error
	for i := 0; i < 50 && isMountPoint(path); i++ {
		if err = unix.Unmount(path, 0); err == nil || errors.Is(err, unix.EINVAL) {
			err = nil
			continue
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
		if serr := sleepCtx(ctx, 100*time.Millisecond); serr != nil {
			return serr
		}
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if isMountPoint(path) {
		return errdefs.Unavailablef("%s is still mounted", path)
	}
	return nil
}

// saveKernel writes sandbox id's kernel and memory into runscDir as
// `runsc checkpoint --compression=none [--leave-running]` does: the state,
// page metadata and pages files (the names runsc restore reads), passed to
// the sentry's containerManager.Checkpoint.
func (d *Driver) saveKernel(ctx context.Context, id, runscDir string, leaveRunning bool) error {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		f, err := os.OpenFile(filepath.Join(runscDir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	arg := saveOpts{Metadata: map[string]string{"compression": "none"}, HavePagesFile: true, Resume: leaveRunning}
	// The disk writes the pages while the sentry saves them, so the fsync
	// after the resume (syncTree) has little left: it is what a strict
	// tool call's acknowledgement waits for (writebehind).
	wb := writebehind.Files(files, writebehind.Interval)
	defer wb.Stop()
	return d.control(ctx, id, ctlCheckpoint, &arg, files...)
}

// saveKernelRetried is saveKernel, made again while a port-forward proxy
// whose connection holdAgentDials closed is still registered in the
// sentry (its teardown is a goroutine of the sentry's own, which the pause
// does not stop: the save fails naming waiter.ChannelNotifier), still
// frozen, once the proxy had time to go.
func (d *Driver) saveKernelRetried(ctx context.Context, id, runscDir string, leaveRunning bool) error {
	for attempt := 1; ; attempt++ {
		err := d.saveKernel(ctx, id, runscDir, leaveRunning)
		if err == nil {
			return nil
		}
		if attempt == 5 || !proxyStillRegistered(err) {
			return checkpointError(id, err)
		}
		d.log.Debug("checkpoint: a closed port-forward proxy is still registered; saving again", "sandbox", id, "attempt", attempt)
		if err := os.RemoveAll(runscDir); err != nil {
			return err
		}
		if err := os.Mkdir(runscDir, 0o700); err != nil {
			return err
		}
		if err := sleepCtx(ctx, time.Duration(attempt)*20*time.Millisecond); err != nil {
			return err
		}
	}
}

// proxyStillRegistered reports whether a save failed on a port-forward
// proxy's waiter (see Checkpoint).
func proxyStillRegistered(err error) bool {
	var ce *controlError
	return errors.As(err, &ce) && strings.Contains(ce.msg, "waiter.ChannelNotifier")
}
