package engine

// Restore, fork and recover (the checkpoint's order: checkpoint.go).
//
// # Restore
//
// The image is fetched into a work directory and verified chunk by chunk
// (a damaged or missing object is errdefs.ErrDataLoss naming it; nothing
// runs), the manifest's driver, runtime build and CPU features must be this
// node's (hostcompat.go), the sandbox's template is the exact version the
// image was cut on (fetched from the blob store when this node has no
// copy, whatever the template's tag names now), and then the driver
// restores it: in place (the same sandbox id, its running incarnation
// killed first; the row goes restoring → running, one
// generation on) or as a new sandbox (a fork; the original keeps running).
// The sandbox.restored event is the fidelity report: processes, memory,
// files and connections the driver brought back.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
)

// Restore brings checkpoint r.Checkpoint back: into its own sandbox, or
// into a new one when r.AsNew.
func (e *checkpointer) Restore(ctx context.Context, r RestoreRequest) (meta.Sandbox, error) {
	ck, err := e.GetCheckpoint(ctx, r.Tenant, r.Checkpoint)
	if err != nil {
		return meta.Sandbox{}, err
	}
	target := ck.SandboxID
	if r.AsNew {
		target = ""
	}
	return e.restore(ctx, ck, target, r.Progress)
}

// Recover restores sandbox id in place from its latest committed
// checkpoint (for a fork without checkpoints of its own: the checkpoint it
// was forked from).
func (e *checkpointer) Recover(ctx context.Context, tenant, id string, progress func(Progress)) (meta.Sandbox, error) {
	return e.RecoverTo(ctx, tenant, id, 0, progress)
}

// RecoverTo is Recover to the state as of event toEvent of the sandbox's
// stream: the newest committed checkpoint whose cut is at or before that
// event (0: the newest of all).
func (e *checkpointer) RecoverTo(ctx context.Context, tenant, id string, toEvent uint64, progress func(Progress)) (meta.Sandbox, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	var ck meta.Checkpoint
	if toEvent > 0 {
		cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{SandboxID: id, States: []meta.CheckpointState{meta.CheckpointCommitted}})
		if err != nil {
			return sb, err
		}
		for _, c := range cks {
			if c.Seq <= toEvent && e.usableLocal(ctx, c) {
				ck = c
			}
		}
		if ck.ID == "" {
			return sb, errdefs.FailedPreconditionf("sandbox %s has no checkpoint cut at or before event %d", id, toEvent)
		}
		return e.restore(ctx, ck, id, progress)
	}
	ck, err = e.latestCheckpoint(ctx, id)
	for tries := 0; err == nil && !e.usableLocal(ctx, ck); tries++ {
		if tries == 16 {
			return sb, errdefs.Unavailablef("sandbox %s: its newest checkpoints' images are lost and cannot be recorded so", id)
		}
		ck, err = e.latestCheckpoint(ctx, id) // it failed: the one before
	}
	if errdefs.IsNotFound(err) && sb.Origin != "" {
		ck, err = e.meta.Checkpoint(ctx, sb.Origin)
	}
	if errdefs.IsNotFound(err) {
		return sb, errdefs.FailedPreconditionf("sandbox %s has no checkpoint to recover from", id)
	}
	if err != nil {
		return sb, err
	}
	return e.restore(ctx, ck, id, progress)
}

// restore restores ck into sandbox target (a new sandbox when target is "").
func (e *checkpointer) restore(ctx context.Context, ck meta.Checkpoint, target string, progress func(Progress)) (meta.Sandbox, error) {
	if err := e.admit(ctx, ck.Tenant); err != nil {
		return meta.Sandbox{}, err
	}
	return e.restoreWith(ctx, ck, target, progress, false)
}

// restoreWith is restore; with resumeIdle it restores target only if it is
// still stopped for being idle and returns it as it is when it runs again.
func (e *checkpointer) restoreWith(ctx context.Context, ck meta.Checkpoint, target string, progress func(Progress), resumeIdle bool) (meta.Sandbox, error) {
	start := time.Now()
	ctx, span := e.span(ctx, "engine.restore", ck.Tenant, target, tracing.CheckpointID.String(ck.ID))
	sb, err := e.restoreOnce(ctx, ck, target, progress, resumeIdle)
	if sb.ID != "" {
		span.SetAttributes(tracing.SandboxID.String(sb.ID))
	}
	tracing.End(span, err)
	if e.obs != nil {
		kind := ""
		if err != nil {
			kind = errdefs.Kind(err)
		}
		e.obs.Restore(e.drv.Name(), kind, time.Since(start))
	}
	return sb, err
}

func (e *checkpointer) restoreOnce(ctx context.Context, ck meta.Checkpoint, target string, progress func(Progress), resumeIdle bool) (meta.Sandbox, error) {
	// The phases, for the restore figures (docs/benchmarks.md): checks and
	// the template, the image (hot copy or fetch), the rows, leases and
	// egress run before the driver, the driver, the rows and log after.
	tStart := time.Now()
	cp, tmpl, src, err := e.restoreInputs(ctx, ck)
	if err != nil {
		return meta.Sandbox{}, err
	}

	// The node's hot copy, or fetch and verify, before touching any
	// sandbox.
	fetchStart := time.Now()
	img, err := e.restoreImage(ctx, ck, progress)
	if err != nil {
		return meta.Sandbox{}, err
	}
	dir, hot, imageDigest := img.dir, img.hot, img.digest
	// A lazy restore reads the image until its load ends (lazy.go): then
	// awaitLoad releases it, else this call does.
	release, handedOff := e.holdImage(ck.ID, dir, hot), false
	defer func() {
		if !handedOff {
			release()
		}
	}()
	fetched := time.Since(fetchStart)

	var sb meta.Sandbox
	replaced := false
	keepConns := false // see restoreKeepsConnections
	if target == "" {
		release, err := e.qt.reserveSandbox(ctx, ck.Tenant, src.Limits)
		if err != nil {
			return meta.Sandbox{}, err
		}
		defer release()
		sb = meta.Sandbox{ID: newID(), Tenant: ck.Tenant, Template: ck.Template, TemplateVersion: ck.TemplateVersion,
			Driver: ck.Driver, Limits: src.Limits, Env: src.Env, State: meta.StateRestoring, Origin: ck.ID, Policy: src.Policy, Node: e.lease.nodeID}
		defer e.lock(sb.ID)()
		if sb, err = e.meta.Insert(ctx, sb); err != nil {
			return sb, err
		}
	} else {
		defer e.lock(target)()
		if sb, err = e.meta.Get(ctx, target); err != nil {
			return sb, err
		}
		if err := e.ownedHere(sb); err != nil {
			return sb, err
		}
		if resumeIdle && sb.State == meta.StateRunning {
			return sb, nil // another call resumed it
		}
		if resumeIdle && !e.suspended(sb) {
			return sb, errdefs.FailedPreconditionf("sandbox %s is %s, not running", sb.ID, sb.State)
		}
		switch sb.State {
		case meta.StateRunning, meta.StateStopped, meta.StateCrashed:
		case meta.StateRestoring:
			// Under its lock, so no restore of it is under way: one that
			// failed or died half-way left the row so (and maybe the
			// sandbox running). It is restored again.
		case meta.StateDestroyed:
			return sb, errdefs.FailedPreconditionf("sandbox %s is destroyed; restore checkpoint %s as a new sandbox", sb.ID, ck.ID)
		default:
			return sb, errdefs.FailedPreconditionf("sandbox %s is %s", sb.ID, sb.State)
		}
		// A fenced node restores nothing.
		if _, err := e.holdLease(ctx, sb.ID); err != nil {
			return sb, err
		}
		keepConns = e.eg.restoreKeepsConnections(ctx, sb, ck)
		if sb.State == meta.StateRunning || sb.State == meta.StateRestoring {
			replaced = sb.State == meta.StateRunning
			if err := e.killAndWait(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
				return sb, err
			}
		}
		from := sb.State
		if err = e.storeRetry(ctx, "mark the sandbox restoring", func(ctx context.Context) (err error) {
			sb, err = e.meta.SetState(ctx, target, meta.StateRestoring, "restoring from "+ck.ID, from, meta.StateRestoring) // a retry after an applied attempt
			return err
		}); err != nil {
			return sb, err
		}
	}
	lg := e.lg.With("sandbox_id", sb.ID, "checkpoint_id", ck.ID)
	report(progress, Progress{Phase: "restore"})
	// Connections through the gateway whose sandbox end will not come
	// back as it was are reset first (see restoreKeepsConnections).
	if !keepConns {
		e.resetEgress(sb.ID, "restore from "+ck.ID)
	}
	// The re-run's requests are numbered from the cut restored from; the
	// run starts before the sandbox does.
	err = e.eg.startRun(ctx, sb, ck.ID, false)
	var rs sandbox.RestoreStats
	var tDriver time.Time
	if err == nil {
		// The driver rebuilds the layer: no file operation meanwhile
		// (see cutLock; a file operation that does not end within
		// CutLockTimeout fails the restore Unavailable, cutLocks).
		var unlockCut func()
		if unlockCut, err = e.cuts.cut(ctx, sb.ID, "restore"); err == nil {
			tDriver = time.Now()
			dctx, dcancel := context.WithTimeout(ctx, e.ck.drvTimeout)
			if err = e.ck.fps.EvalCtx(dctx, FPDriverRestore, sb.ID); err == nil {
				rs, err = cp.Restore(dctx, sandbox.Spec{ID: sb.ID, Tenant: sb.Tenant, Template: tmpl, Limits: sb.Limits, Env: sb.Env}, dir,
					sandbox.RestoreOptions{Lazy: !e.ck.eager && e.drv.Capabilities().LazyRestore})
			}
			dcancel()
			unlockCut()
		}
	}
	if err != nil {
		return sb, e.restoreFailed(ctx, lg, sb, ck, target, err)
	}
	if rs.Loaded != nil {
		handedOff = true
		go e.awaitLoad(lg, rs.Loaded, release)
	}
	tRecord := time.Now()
	if hot {
		// It runs: now read the copy's bytes (hottier.go, Integrity).
		e.ck.hot.spawn(img.verify)
	}
	sb, err = e.recordRestored(ctx, sb, ck, target == "", RestoredPayload{
		Checkpoint: ck.ID, From: ck.SandboxID, Seq: ck.Seq, ImageDigest: imageDigest, Hot: hot,
		Processes: rs.Processes, MemoryBytes: rs.MemoryBytes, Files: rs.Files,
		ConnectionsRestored: rs.ConnectionsRestored, ConnectionsReset: rs.ConnectionsReset, Lazy: rs.Lazy,
		FetchNS: int64(fetched), RunningNS: int64(rs.Running), Replaced: replaced,
	}, rs)
	if err != nil {
		return sb, err
	}
	lg.InfoContext(ctx, "sandbox restored", "fork", target == "", "hot", hot, "fetch", fetched.Round(time.Millisecond),
		"running", rs.Running.Round(time.Millisecond), "processes", rs.Processes,
		"checks", fetchStart.Sub(tStart).Round(time.Millisecond), "prepare", tDriver.Sub(fetchStart.Add(fetched)).Round(time.Millisecond),
		"driver", tRecord.Sub(tDriver).Round(time.Millisecond), "record", time.Since(tRecord).Round(time.Millisecond))
	return sb, nil
}

// restoreFailed takes the row of sb, whose restore from ck failed (err),
// out of "restoring": a new sandbox (target "") is destroyed, one restored
// in place is crashed (and can be restored again). It returns the
// restore's error.
func (e *checkpointer) restoreFailed(ctx context.Context, lg *slog.Logger, sb meta.Sandbox, ck meta.Checkpoint, target string, err error) error {
	cleanup := context.WithoutCancel(ctx)
	reason := fmt.Sprintf("restore from %s failed: %v", ck.ID, err)
	if target == "" {
		if derr := e.drv.Destroy(cleanup, sb.ID); derr != nil {
			lg.Error("destroy after failed restore", "err", derr)
		}
		_, _ = e.meta.SetState(cleanup, sb.ID, meta.StateDestroyed, reason)
	} else if merr := e.markCrashed(cleanup, sb, EventCrashed, reason); merr != nil {
		lg.Error("record failed restore", "err", merr)
	}
	return fmt.Errorf("restore %s from %s: %w", sb.ID, ck.ID, err)
}

// restoreInputs checks that ck can be restored here and returns the
// checkpoint store, the exact template version ck was cut on and the row
// of the sandbox ck was cut from.
func (e *checkpointer) restoreInputs(ctx context.Context, ck meta.Checkpoint) (sandbox.Checkpointer, sandbox.Template, meta.Sandbox, error) {
	cp, err := e.checkpointStore()
	if err != nil {
		return nil, sandbox.Template{}, meta.Sandbox{}, err
	}
	if ck.State != meta.CheckpointCommitted {
		return nil, sandbox.Template{}, meta.Sandbox{}, errdefs.FailedPreconditionf("checkpoint %s is %s, not committed", ck.ID, ck.State)
	}
	if ck.Driver != e.drv.Name() {
		return nil, sandbox.Template{}, meta.Sandbox{}, errdefs.FailedPreconditionf("checkpoint %s was cut by driver %s; this daemon runs %s", ck.ID, ck.Driver, e.drv.Name())
	}
	tmpl, err := e.restoreTemplate(ctx, ck)
	if err != nil {
		return nil, sandbox.Template{}, meta.Sandbox{}, err
	}
	src, err := e.meta.Get(ctx, ck.SandboxID)
	return cp, tmpl, src, err
}

// recordRestored records sandbox sb, restored from ck and running: its
// row, then its events (sandbox.created for a new one, then
// sandbox.restored with p, its generation and the checkpoints lost). Both
// are retried through a store error or full-disk window (storeRetry):
// giving up here left the row "restoring" for the next attempt to kill
// the sandbox and restore it again.
func (e *checkpointer) recordRestored(ctx context.Context, sb meta.Sandbox, ck meta.Checkpoint, isNew bool, p RestoredPayload, rs sandbox.RestoreStats) (meta.Sandbox, error) {
	id, tried := sb.ID, false
	if err := e.storeRetry(ctx, "record the restore", func(ctx context.Context) (err error) {
		if tried { // applied, its answer lost: the row runs from ck now
			if cur, err := e.meta.Get(ctx, id); err == nil && cur.State == meta.StateRunning && cur.Origin == ck.ID {
				sb = cur
				return nil
			}
		}
		tried = true
		sb, err = e.meta.Restored(ctx, id, ck.ID)
		return err
	}); err != nil {
		return sb, err
	}
	var evs []eventlog.Event
	if isNew {
		evs = append(evs, lifecycleEvent(sb, EventCreated, CreatedPayload{
			Template: sb.Template, TemplateVersion: sb.TemplateVersion, Driver: sb.Driver, Limits: sb.Limits}))
	}
	lost := e.lostAfter(ctx, ck)
	p.Generation, p.LostCheckpoints, p.NotRestored = sb.Generation, lost, notRestored(rs, lost)
	evs = append(evs, lifecycleEvent(sb, EventRestored, p))
	err := e.storeRetry(ctx, "append the restore's events", func(ctx context.Context) error {
		return e.appendEvents(ctx, sb, evs...) // idempotent: the events' ids
	})
	return sb, err
}

// notRestored is the restored event's list of what did not come back:
// the driver's and the checkpoints lost before their upload.
func notRestored(rs sandbox.RestoreStats, lostCheckpoints []string) []sandbox.Loss {
	out := slices.Clone(rs.NotRestored)
	if len(lostCheckpoints) > 0 {
		out = append(out, sandbox.Loss{Kind: sandbox.LossCheckpoints, Count: len(lostCheckpoints),
			Detail: "lost before their upload (the restore fell back past them): " + strings.Join(lostCheckpoints, ", ")})
	}
	return out
}

// lostBeforeUpload fails ck, whose upload is pending and whose hot copy
// is gone or damaged (why), and returns the restore's error.
func (e *checkpointer) lostBeforeUpload(ctx context.Context, ck meta.Checkpoint, why error) error {
	if err := e.uploadLost(ctx, ck, why); err != nil {
		e.lg.Error("record lost checkpoint", "checkpoint_id", ck.ID, "err", err)
	}
	return errdefs.DataLossf("checkpoint %s: its image was lost before its upload: %v", ck.ID, why)
}

// restoreTemplate checks what ck's image depends on (refused before
// anything is fetched) and returns exactly the template version it was cut
// on, whatever the template's tag says now (fetched from the blob store if
// this node has no copy).
func (e *checkpointer) restoreTemplate(ctx context.Context, ck meta.Checkpoint) (sandbox.Template, error) {
	var m *chunkstore.Manifest
	var err error
	if ck.UploadPending {
		// No manifest yet: its metadata is the hot copy's (upload.go).
		m = &chunkstore.Manifest{Meta: e.ck.hot.metaOf(ck.ID)}
		if m.Meta == nil {
			return sandbox.Template{}, e.lostBeforeUpload(ctx, ck, errNoHotCopy)
		}
	} else if m, err = e.ck.store.Manifest(ctx, ck.Tenant, ck.ID); err != nil {
		return sandbox.Template{}, fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	if err := e.checkImageCompat(ctx, ck, m); err != nil {
		return sandbox.Template{}, err
	}
	tmpl, err := e.tpl.cat.Version(ctx, ck.Template, ck.TemplateVersion)
	if errdefs.IsNotFound(err) {
		return tmpl, errdefs.FailedPreconditionf("checkpoint %s was cut on template %s version %s, which neither this node nor the blob store has (a memory image runs only on the files it was cut on): %v",
			ck.ID, ck.Template, ck.TemplateVersion, err)
	}
	if err != nil {
		return tmpl, fmt.Errorf("checkpoint %s was cut on template %s version %s, which this node cannot provide (a memory image runs only on the files it was cut on): %w",
			ck.ID, ck.Template, ck.TemplateVersion, err)
	}
	return tmpl, nil
}

// specFor is the driver spec that runs sb under id.
func (e *checkpointer) specFor(sb meta.Sandbox, id string) sandbox.Spec {
	t, _ := e.tpl.cat.Version(context.Background(), sb.Template, sb.TemplateVersion)
	return sandbox.Spec{ID: id, Tenant: sb.Tenant, Template: t, Limits: sb.Limits, Env: sb.Env}
}

// killAndWait SIGKILLs sandbox id and waits until the driver reports it
// stopped.
func (e *checkpointer) killAndWait(ctx context.Context, id string) error {
	e.stopping(ctx, id)
	if err := e.drv.Kill(ctx, id); err != nil {
		return fmt.Errorf("kill %s before restoring it: %w", id, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		in, err := e.drv.Inspect(ctx, id)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if err != nil || in.State != sandbox.StateRunning {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailablef("sandbox %s still runs 30s after SIGKILL", id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// restoreImage is where a restore of ck reads its image from: the node's
// hot copy when it has a good one (hottier.go), else the chunk store,
// fetched into a work directory and verified chunk by chunk. The caller
// removes dir.
type restoreImage struct {
	dir, digest string
	hot         bool
	verify      func() // the hot copy's byte check, once the sandbox runs
}

func (e *checkpointer) restoreImage(ctx context.Context, ck meta.Checkpoint, progress func(Progress)) (restoreImage, error) {
	dir, verify, err := e.ck.hot.take(ck, e.ck.workDir, func() ([]chunkstore.Entry, error) {
		m, err := e.ck.store.Manifest(context.WithoutCancel(ctx), ck.Tenant, ck.ID)
		if err != nil {
			return nil, err
		}
		return m.Entries, nil
	})
	if err == nil {
		return restoreImage{dir: dir, digest: ck.ImageDigest, hot: true, verify: verify}, nil
	}
	if ck.UploadPending {
		return restoreImage{}, e.lostBeforeUpload(ctx, ck, err)
	}
	dir = filepath.Join(e.ck.workDir, "fetch-"+strings.TrimPrefix(newID(), "sbx-"))
	report(progress, Progress{Phase: "fetch"})
	rr, err := e.ck.store.Restore(ctx, ck.Tenant, ck.ID, dir, chunkstore.RestoreOptions{
		Progress: func(p chunkstore.Progress) { report(progress, Progress{Phase: "fetch", Done: p.Done, Total: p.Total}) },
	})
	if err != nil {
		os.RemoveAll(dir)
		return restoreImage{}, fmt.Errorf("fetch checkpoint %s: %w", ck.ID, err)
	}
	return restoreImage{dir: dir, digest: rr.Manifest.ImageDigest}, nil
}
