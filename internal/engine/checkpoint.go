package engine

// Checkpoint, and the checkpoints' records (restore, fork and recover:
// restore.go).
//
// # Checkpoint: durability order
//
//  0. the sandbox's template version is in the blob store (its chunks, then
//     its record: internal/state/templatestore), so the checkpoint never refers
//     to files another node could not fetch;
//  1. intent: a pending row in the metadata store (meta.Checkpoint) names the
//     checkpoint, its sandbox and the log position of the cut (the head of
//     the sandbox's stream, read under the sandbox's lock, so no lifecycle
//     event interleaves);
//  2. cut: the driver freezes the sandbox and writes the image (memory,
//     processes, writable layer) to a work directory, then resumes it (or
//     leaves it stopped);
//  3. data: the chunk store writes the chunks, then the manifest (see
//     internal/state/chunkstore for its own order);
//  4. commit hook: the engine renews (or takes) its lease on the sandbox's
//     stream — a stale epoch is errdefs.ErrFenced and nothing is published —
//     then the chunk store writes the pointer that makes the checkpoint
//     visible, then the engine appends sandbox.checkpointed under the same
//     epoch, carrying the checkpoint as its CheckpointRef;
//  5. the row becomes committed.
//
// A crash before 4 leaves a pending row and unreferenced chunks: the next
// start marks the row failed (reconcileCheckpoints) and the chunk store's
// collector removes the chunks. A crash between the pointer and the row
// commit is settled from the log: the checkpoint counts only if its
// sandbox.checkpointed event is there; otherwise its pointer is deleted.
//
// The strict policy on a node whose stores are its own (not
// Options.Cluster.Shared) acknowledges an exec once its checkpoint is
// durable on the node, and uploads it after (upload.go); in a cluster the
// order above stands, the upload before the ack.
//
// # Strict on local stores: durability order
//
//  1. intent: the pending row (step 1 above);
//  2. cut: the driver writes the image to a work directory (step 2);
//  3. hot: the image becomes the sandbox's pinned hot copy — every file
//     fsync'd, hot.json (the files' sizes, times and inodes, and the
//     manifest metadata) written and fsync'd, the directory renamed into
//     hot/ and hot/ fsync'd (hottier.go) — and the digest of its hot.json
//     is the copy's integrity record;
//  4. local commit: the lease is held (a stale epoch is ErrFenced, nothing
//     is published), sandbox.checkpointed is appended (no manifest digest
//     yet), and the row becomes committed with UploadPending and the
//     record (HotDigest);
//  5. the exec is acknowledged;
//  6. in the background, one sandbox's uploads in order: the template
//     version is pushed (step 0 of the order above, which the intent left
//     to the upload: a sandbox's first cut does not wait for it), the copy
//     is checked against the row's record, then the chunk store writes the
//     chunks, the manifest and the pointer from it, then FinishUpload
//     records the digests and clears the mark, and the copy is unpinned.
//
// A crash before 4 leaves a pending row (the next start fails it and drops
// its copy, as for any checkpoint); one between the log event and the row
// commit too (the row, not the log, says which checkpoints count). A crash
// after 4 leaves a committed row with its upload pending: the next start
// pins its copy and uploads it (reconcileUploads). Until the upload ends,
// a restore on this node uses the hot copy, checked against the row's
// record (the manifest does not exist yet), and nothing else can restore
// the checkpoint: a copy lost or damaged before its upload ends makes the
// checkpoint failed (never used), and a restore to an event falls back to
// an older one, the restored event naming the lost ones (LostCheckpoints).
//
// A second strict checkpoint while one uploads keeps both copies: the
// pinned older one stays until its upload ends (uploads of one sandbox run
// in order, so each upload's parent is stored), then the newest copy is the
// only one. Retention and DeleteCheckpoint leave a checkpoint whose upload
// is pending alone; the hot tier's size bound does not evict a pinned copy.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// checkpointer is checkpointing and restore (checkpoint.go, restore.go,
// gc.go, hostcompat.go, the hot tier: hottier.go, uploads behind local
// commits: upload.go). Besides the core it
// calls the egress runs (a cut holds and restarts a sandbox's run, a
// restore starts one) and the quotas (checkpoint bytes, a restore's new
// sandbox); it names nothing of metering or budgets, which observe it
// through the lifecycle hooks (lifecycle.go).
type checkpointer struct {
	*core
	ck checkpointing
	eg *egressRunner
	qt *quotas
}

// checkpointing is the state of checkpoints and restores (checkpoint.go,
// restore.go, gc.go, hostcompat.go).
type checkpointing struct {
	store       *chunkstore.Store
	workDir     string
	keep        int
	cpuFeatures func() ([]string, error)
	gcs         sync.Map // tenant → *gcState (gc.go)
	hot         *hotTier // the node's newest images (hottier.go)
	drvTimeout  time.Duration
	eager       bool           // RecoveryOptions.EagerRestore
	up          uploads        // uploads behind local commits (upload.go)
	fps         *failpoint.Set // Options.Failpoints
}

// Progress reports a long checkpoint or restore: the phase ("cut",
// "upload", "fetch", "restore") and, for transfers, bytes done of total.
type Progress struct {
	Phase string `json:"phase"`
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
}

// CheckpointRequest asks for a checkpoint of a running sandbox.
type CheckpointRequest struct {
	Tenant, Sandbox string
	// Tag names the checkpoint and keeps it from retention.
	Tag string
	// Stop leaves the sandbox stopped once the checkpoint is committed
	// (recover or restore brings it back).
	Stop     bool
	Progress func(Progress)
	// stopReason, when set, is the stopped sandbox's reason (idle.go).
	stopReason string
	// uploadBehind commits on the node and uploads after (the strict
	// policy on local stores: upload.go); not with Stop.
	uploadBehind bool
}

// RestoreRequest asks for a restore of a checkpoint.
type RestoreRequest struct {
	Tenant, Checkpoint string
	// AsNew restores into a new sandbox (a fork); otherwise the
	// checkpoint's own sandbox is brought back to the cut.
	AsNew    bool
	Progress func(Progress)
}

func (e *checkpointer) checkpointStore() (sandbox.Checkpointer, error) {
	cp, ok := e.drv.(sandbox.Checkpointer)
	if !ok || !e.drv.Capabilities().Checkpoint {
		return nil, errdefs.FailedPreconditionf("driver %s cannot checkpoint", e.drv.Name())
	}
	if e.ck.store == nil {
		return nil, errdefs.FailedPreconditionf("this daemon has no checkpoint store")
	}
	return cp, nil
}

func newCheckpointID() string { return "ckpt-" + strings.TrimPrefix(newID(), "sbx-") }

func validTag(tag string) error {
	if len(tag) > 64 || strings.Trim(tag, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		return errdefs.InvalidArgumentf("tag %.70q: at most 64 letters, digits, '.', '_' or '-'", tag)
	}
	return nil
}

func report(f func(Progress), p Progress) {
	if f != nil {
		f(p)
	}
}

// Observer is told about checkpoints and restores (internal/obs/metrics).
type Observer interface {
	// Checkpoint: kind is "" on success, else the error's kind.
	Checkpoint(driver, tenant, kind string, frozen, total time.Duration, stored int64)
	Restore(driver, kind string, d time.Duration)
}

// Checkpoint cuts sandbox r.Sandbox and commits the image (see the order
// above). Never two at once for one sandbox: it holds the sandbox's lock.
func (e *checkpointer) Checkpoint(ctx context.Context, r CheckpointRequest) (meta.Checkpoint, error) {
	start := time.Now()
	ctx, span := e.span(ctx, "engine.checkpoint", r.Tenant, r.Sandbox)
	ck, err := e.checkpoint(ctx, r)
	if ck.ID != "" {
		span.SetAttributes(tracing.CheckpointID.String(ck.ID), tracing.StoredBytes.Int64(ck.Stats.StoredBytes))
	}
	tracing.End(span, err)
	if e.obs != nil && (err == nil || ck.ID != "") {
		kind := ""
		if err != nil {
			kind = errdefs.Kind(err)
		}
		e.obs.Checkpoint(e.drv.Name(), ck.Tenant, kind, time.Duration(ck.Stats.FrozenNS), time.Since(start), ck.Stats.StoredBytes)
	}
	return ck, err
}

// checkable refuses r before anything is locked or written: no checkpoint
// store, a bad tag, a sandbox not running, a quota reached.
func (e *checkpointer) checkable(ctx context.Context, r CheckpointRequest) (sandbox.Checkpointer, error) {
	cp, err := e.checkpointStore()
	if err != nil {
		return nil, err
	}
	if err := validTag(r.Tag); err != nil {
		return nil, err
	}
	if _, err := e.running(ctx, r.Tenant, r.Sandbox); err != nil {
		return nil, err
	}
	return cp, e.qt.checkCheckpointQuota(ctx, r.Tenant)
}

func (e *checkpointer) checkpoint(ctx context.Context, r CheckpointRequest) (meta.Checkpoint, error) {
	cp, err := e.checkable(ctx, r)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	id := r.Sandbox
	defer e.lock(id)()
	sb, err := e.meta.Get(ctx, id)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	if sb.State != meta.StateRunning {
		return meta.Checkpoint{}, errdefs.FailedPreconditionf("sandbox %s is %s, not running", id, sb.State)
	}
	ck, parent, hostMeta, err := e.checkpointIntent(ctx, id, sb, r.Tag, !r.uploadBehind || r.Stop) // behind: the upload pushes
	if err != nil {
		return ck, err
	}
	lg := e.lg.With("sandbox_id", id, "checkpoint_id", ck.ID)
	fail := func(err error) (meta.Checkpoint, error) {
		if merr := e.failRow(ctx, ck.ID, err); merr != nil {
			lg.Error("record failed checkpoint", "err", merr)
		}
		lg.WarnContext(ctx, "checkpoint failed", "err", err)
		e.collect(ck.Tenant) // what it stored is garbage now
		return ck, err
	}

	dir := filepath.Join(e.ck.workDir, "cut-"+ck.ID)
	keptHot := false // the hot tier took dir (hottier.go)
	defer func() {
		if !keptHot {
			os.RemoveAll(dir)
		}
	}()
	start := time.Now()
	report(r.Progress, Progress{Phase: "cut"})
	unlockCut, err := e.cuts.cut(ctx, id, "checkpoint")
	if err != nil {
		return fail(err) // nothing cut: the sandbox runs on, its loop tries again
	}
	releaseEgress := e.eg.holdEgress(id)
	if r.Stop {
		e.stopping(ctx, id) // its cgroup goes with the cut
	}
	cs, err := e.driverCut(ctx, cp, id, dir, r.Stop)
	if err == nil {
		// Requests from here on are the run this cut starts.
		err = e.eg.startRun(ctx, sb, ck.ID, false)
	}
	releaseEgress()
	if r.Stop {
		// The sandbox no longer runs but its row says running until the
		// commit: calls into it wait here, then find it stopped (and an
		// idle-stopped one resumes).
		defer unlockCut()
	} else {
		unlockCut()
	}
	if err != nil {
		return fail(fmt.Errorf("checkpoint %s: %w", id, err))
	}
	dumped := time.Since(start)
	committed := false
	if r.Stop {
		// The driver left it stopped: until the checkpoint commits, the
		// image in dir is the sandbox's only copy of its state, and a
		// failed commit resumes the sandbox from it.
		defer func() {
			if !committed {
				e.resumeFromCut(ctx, cp, sb, dir)
			}
		}()
	}

	payload := CheckpointedPayload{Checkpoint: ck.ID, Seq: ck.Seq, FrozenNS: int64(cs.Frozen),
		MemoryBytes: cs.MemoryBytes, LayerBytes: cs.LayerBytes, Stopped: r.Stop}
	var eventSeq uint64
	upStart, pm := time.Now(), manifestMeta(id, ck, sb, hostMeta)
	if r.uploadBehind && !r.Stop {
		lck, took, err := e.commitLocal(ctx, ck, sb, dir, pm, payload, cs, dumped, start)
		if keptHot = took; err != nil {
			return fail(fmt.Errorf("commit checkpoint of %s on the node: %w", id, err))
		} else if took {
			return lck, nil
		}
	}
	res, err := e.ck.store.Put(ctx, sb.Tenant, ck.ID, dir, chunkstore.PutOptions{
		Parent: parent.ID, Meta: pm, Unchanged: isLayerBlob,
		Progress: func(p chunkstore.Progress) {
			report(r.Progress, Progress{Phase: "upload", Done: p.Done, Total: p.Total})
		},
		Commit: func(ctx context.Context, digest string, publish func(context.Context) error) error {
			l, err := e.holdLease(ctx, id)
			if err != nil {
				return err
			}
			if err := publish(ctx); err != nil {
				return err
			}
			payload.ManifestDigest = digest
			ev := eventWithID(sb, ck.ID+".checkpointed", EventCheckpointed, payload)
			ev.CheckpointRef = ck.ID
			ar, err := e.log.Append(ctx, Stream(id), l.Epoch, eventlog.Any, ev)
			if err != nil {
				return fmt.Errorf("record checkpoint in the log: %w", err)
			}
			eventSeq = ar.Last
			return nil
		},
	})
	switch {
	case err != nil && eventSeq == 0:
		if res.Published {
			// Visible in storage but not in the log: it must not count.
			if _, derr := e.ck.store.DeleteCheckpoint(context.WithoutCancel(ctx), sb.Tenant, ck.ID); derr != nil {
				lg.Error("delete checkpoint the log does not reference", "err", derr)
			}
		}
		return fail(fmt.Errorf("commit checkpoint of %s: %w", id, err))
	case err != nil:
		// The pointer and the log event are written: the checkpoint
		// exists, whatever failed after them.
		lg.WarnContext(ctx, "checkpoint committed; a later step failed", "err", err)
	}
	committed = true
	ck.ManifestDigest, ck.ImageDigest, ck.EventSeq = res.ManifestDigest, res.ImageDigest, eventSeq
	ck.Stats = meta.CheckpointStats{
		FrozenNS: int64(cs.Frozen), DumpNS: int64(dumped), UploadNS: int64(time.Since(upStart)), TotalNS: int64(time.Since(start)),
		MemoryBytes: cs.MemoryBytes, LayerBytes: cs.LayerBytes, ImageBytes: res.Size, StoredBytes: res.StoredBytes,
		Chunks: res.Chunks, NewChunks: res.NewChunks,
	}
	if ck, err = e.commitRow(ctx, ck); err != nil {
		return ck, err // committed in storage and log; the next start settles the row
	}
	// Committed: its image stays on the node as the sandbox's hot copy.
	keptHot = e.ck.hot.keepAsync(ck, dir)
	if r.Stop {
		if sb, err = e.stoppedAtCut(ctx, id, r.stopReason); err != nil {
			return ck, err
		}
	}
	if err := e.retain(ctx, sb); err != nil {
		lg.Warn("retention", "err", err)
	}
	lg.InfoContext(ctx, "checkpoint committed", "frozen", cs.Frozen.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond),
		"image_bytes", res.Size, "stored_bytes", res.StoredBytes, "new_chunks", res.NewChunks, "chunks", res.Chunks, "reused_files", res.ReusedFiles)
	return ck, nil
}

// driverCut is the driver's Checkpoint, bounded by DriverTimeout. The
// failpoint FPDriverCheckpoint is evaluated first with the bounded
// context (failpoint.Hang: a driver call that does not come back).
func (e *checkpointer) driverCut(ctx context.Context, cp sandbox.Checkpointer, id, dir string, stop bool) (sandbox.CheckpointStats, error) {
	ctx, cancel := context.WithTimeout(ctx, e.ck.drvTimeout)
	defer cancel()
	if err := e.ck.fps.EvalCtx(ctx, FPDriverCheckpoint, id); err != nil {
		return sandbox.CheckpointStats{}, fmt.Errorf("driver checkpoint of %s: %w", id, err)
	}
	return cp.Checkpoint(ctx, id, dir, sandbox.CheckpointOptions{LeaveStopped: stop})
}

// The failpoints in front of the driver's Checkpoint and Restore calls
// (Options.Failpoints; the daemon's AMBER_TEST_FAILPOINTS), evaluated
// with the call's deadline.
const (
	FPDriverCheckpoint = "driver.checkpoint"
	FPDriverRestore    = "driver.restore"
)

// resumeFromCut brings back sandbox sb, left stopped by a cut into dir
// whose checkpoint did not commit; one that cannot be is crashed.
func (e *checkpointer) resumeFromCut(ctx context.Context, cp sandbox.Checkpointer, sb meta.Sandbox, dir string) {
	if _, rerr := cp.Restore(context.WithoutCancel(ctx), e.specFor(sb, sb.ID), dir, sandbox.RestoreOptions{}); rerr != nil {
		e.lg.Error("resume after failed checkpoint-and-stop", "sandbox_id", sb.ID, "err", rerr)
		_ = e.markCrashed(context.WithoutCancel(ctx), sb, EventCrashed, "checkpoint-and-stop failed and the sandbox could not be resumed: "+rerr.Error())
	}
}

// checkpointIntent pushes sandbox id's template version to the blob store
// (with push; else the upload does, templatePushed), reads this host's
// metadata and the log position of the cut, and records the intent: a
// pending row (steps 0 and 1 of the order above). It returns the row, the
// checkpoint's parent and the host metadata. Called with the sandbox's
// lock held.
func (e *checkpointer) checkpointIntent(ctx context.Context, id string, sb meta.Sandbox, tag string, push bool) (ck, parent meta.Checkpoint, hostMeta map[string]string, err error) {
	// The template version is in the blob store before any checkpoint
	// that needs it (its chunks, then its record; then this checkpoint's
	// chunks, manifest and pointer), so any node can restore it. Usually
	// pushed ahead already (tplpush.go); retried through a store error.
	if push {
		if err := e.templatePushed(ctx, meta.Checkpoint{Template: sb.Template, TemplateVersion: sb.TemplateVersion}); err != nil {
			return ck, parent, nil, fmt.Errorf("checkpoint %s: %w", id, err)
		}
	}
	hostMeta = map[string]string{}
	if err := e.hostMeta(ctx, hostMeta); err != nil {
		return ck, parent, nil, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	bounds, err := e.log.Bounds(ctx, Stream(id))
	if err != nil {
		return ck, parent, nil, fmt.Errorf("checkpoint %s: log position: %w", id, err)
	}
	parent, _ = e.latestCheckpoint(ctx, id)
	ck, err = e.meta.InsertCheckpoint(ctx, meta.Checkpoint{
		ID: newCheckpointID(), Tenant: sb.Tenant, SandboxID: id, State: meta.CheckpointPending,
		Parent: parent.ID, Tag: tag, Stream: Stream(id), Seq: bounds.Head,
		Driver: sb.Driver, Template: sb.Template, TemplateVersion: sb.TemplateVersion,
	})
	return ck, parent, hostMeta, err
}

// manifestMeta is the metadata the manifest of ck, a checkpoint of
// sandbox id, carries: where it was cut and on what host (hostMeta).
func manifestMeta(id string, ck meta.Checkpoint, sb meta.Sandbox, hostMeta map[string]string) map[string]string {
	pm := map[string]string{
		"sandbox": id, "stream": ck.Stream, "seq": strconv.FormatUint(ck.Seq, 10), metaDriver: sb.Driver,
		metaTemplate: sb.Template, metaTemplateVersion: sb.TemplateVersion,
	}
	for k, v := range hostMeta {
		pm[k] = v
	}
	return pm
}

// stoppedAtCut records that sandbox id, left stopped by its committed
// checkpoint, is stopped (reason, default stoppedAtCutReason).
func (e *checkpointer) stoppedAtCut(ctx context.Context, id, reason string) (meta.Sandbox, error) {
	if reason == "" {
		reason = stoppedAtCutReason
	}
	sb, err := e.meta.SetState(ctx, id, meta.StateStopped, reason, meta.StateRunning)
	if err != nil {
		return sb, err
	}
	return sb, e.appendEvents(ctx, sb, lifecycleEvent(sb, EventKilled, StatePayload{State: string(sb.State), Reason: reason}))
}

// stoppedAtCutReason is the reason of a sandbox stopped by its own
// checkpoint (checkpoint --stop).
const stoppedAtCutReason = "checkpointed and stopped"

// GetCheckpoint returns checkpoint id if tenant owns it.
func (e *checkpointer) GetCheckpoint(ctx context.Context, tenant, id string) (meta.Checkpoint, error) {
	if id == "" || len(id) > 48 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return meta.Checkpoint{}, errdefs.InvalidArgumentf("checkpoint id %.60q is malformed", id)
	}
	ck, err := e.meta.Checkpoint(ctx, id)
	if err != nil {
		return ck, err
	}
	if ck.Tenant != tenant {
		return meta.Checkpoint{}, errdefs.NotFoundf("checkpoint %s", id)
	}
	return ck, nil
}

// ListCheckpoints returns sandbox id's committed checkpoints, oldest first
// (all states when all is set).
func (e *checkpointer) ListCheckpoints(ctx context.Context, tenant, id string, all bool) ([]meta.Checkpoint, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	f := meta.CheckpointFilter{Tenant: tenant, SandboxID: id}
	if !all {
		f.States = []meta.CheckpointState{meta.CheckpointCommitted}
	}
	return e.meta.Checkpoints(ctx, f)
}

// DeleteCheckpoint removes checkpoint id and the chunks only it used.
func (e *checkpointer) DeleteCheckpoint(ctx context.Context, tenant, id string) error {
	ck, err := e.GetCheckpoint(ctx, tenant, id)
	if err != nil {
		return err
	}
	if ck.State == meta.CheckpointDeleted {
		return nil
	}
	if ck.State == meta.CheckpointPending {
		return errdefs.FailedPreconditionf("checkpoint %s is being written", id)
	}
	if ck.State == meta.CheckpointCommitted && ck.UploadPending {
		return errdefs.FailedPreconditionf("checkpoint %s is being uploaded; try again once it is", id)
	}
	if e.ck.store == nil {
		return errdefs.FailedPreconditionf("this daemon has no checkpoint store")
	}
	e.ck.hot.drop(ck.ID) // the node keeps no copy of a deleted checkpoint
	if _, err := e.ck.store.DeleteCheckpoint(ctx, ck.Tenant, ck.ID); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete checkpoint %s: %w", id, err)
	}
	_, err = e.meta.SetCheckpointState(ctx, id, meta.CheckpointDeleted, "deleted on request")
	return err
}

// reconcileCheckpoints settles the checkpoints a previous daemon left
// pending: one whose pointer exists and whose sandbox.checkpointed event is
// in the log is committed; any other is failed (and its pointer, if any,
// deleted: the log never referenced it).
func (e *checkpointer) reconcileCheckpoints(ctx context.Context) error {
	pend, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{States: []meta.CheckpointState{meta.CheckpointPending}})
	if err != nil {
		return fmt.Errorf("reconcile checkpoints: %w", err)
	}
	for _, ck := range pend {
		lg := e.lg.With("checkpoint_id", ck.ID, "sandbox_id", ck.SandboxID)
		if e.ck.store == nil {
			lg.Warn("pending checkpoint left alone: this daemon has no checkpoint store")
			continue
		}
		info, err := e.ck.store.Stat(ctx, ck.Tenant, ck.ID)
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("reconcile checkpoint %s: %w", ck.ID, err)
		}
		if err == nil {
			seq, ferr := e.findCheckpointEvent(ctx, ck)
			if ferr != nil {
				return fmt.Errorf("reconcile checkpoint %s: %w", ck.ID, ferr)
			}
			if seq > 0 {
				ck.ManifestDigest, ck.EventSeq = info.ManifestDigest, seq
				if m, merr := e.ck.store.Manifest(ctx, ck.Tenant, ck.ID); merr == nil {
					ck.ImageDigest, ck.Stats.ImageBytes = m.ImageDigest, m.Size
				}
				if _, err := e.meta.CommitCheckpoint(ctx, ck); err != nil {
					return err
				}
				lg.Info("pending checkpoint was committed before the daemon stopped")
				continue
			}
			if _, err := e.ck.store.DeleteCheckpoint(ctx, ck.Tenant, ck.ID); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("reconcile checkpoint %s: %w", ck.ID, err)
			}
		}
		e.ck.hot.drop(ck.ID) // the node keeps no copy of a failed checkpoint (upload.go)
		if _, err := e.meta.SetCheckpointState(ctx, ck.ID, meta.CheckpointFailed, "the daemon stopped before the checkpoint committed", meta.CheckpointPending); err != nil {
			return err
		}
		lg.Warn("pending checkpoint failed: the daemon stopped before it committed")
		defer e.collect(ck.Tenant)
	}
	return nil
}

// findCheckpointEvent returns the position of ck's sandbox.checkpointed
// event (0 if the log has none): it follows the cut.
func (e *checkpointer) findCheckpointEvent(ctx context.Context, ck meta.Checkpoint) (uint64, error) {
	for from := ck.Seq + 1; ; {
		evs, err := e.log.Read(ctx, ck.Stream, from, 256)
		if errors.Is(err, errdefs.ErrCompacted) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if len(evs) == 0 {
			return 0, nil
		}
		for _, ev := range evs {
			if ev.Type == EventCheckpointed && ev.CheckpointRef == ck.ID {
				return ev.Seq, nil
			}
		}
		from = evs[len(evs)-1].Seq + 1
	}
}

// retain applies retention to sb's checkpoints: the newest KeepCheckpoints
// committed ones and every tagged one stay, the rest are deleted (pointer,
// then the chunks only they used), and the stream is truncated below the
// sandbox.checkpointed event of the oldest one kept — the log keeps what a
// restore of any kept checkpoint may need to replay, nothing older.
func (e *checkpointer) retain(ctx context.Context, sb meta.Sandbox) error {
	keep := e.ck.keep
	if p := e.tenantPolicy(ctx, sb.Tenant); p.KeepCheckpoints > 0 {
		keep = p.KeepCheckpoints
	}
	if keep <= 0 {
		return nil
	}
	cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{SandboxID: sb.ID, States: []meta.CheckpointState{meta.CheckpointCommitted}})
	if err != nil {
		return err
	}
	var oldestKept uint64
	for i, ck := range cks {
		if ck.Tag != "" || i >= len(cks)-keep || ck.UploadPending {
			if oldestKept == 0 || (ck.EventSeq > 0 && ck.EventSeq < oldestKept) {
				oldestKept = ck.EventSeq
			}
			continue
		}
		e.ck.hot.drop(ck.ID) // the node keeps no copy of a deleted checkpoint
		if _, err := e.ck.store.DeleteCheckpoint(ctx, ck.Tenant, ck.ID); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("retention: delete %s: %w", ck.ID, err)
		}
		if _, err := e.meta.SetCheckpointState(ctx, ck.ID, meta.CheckpointDeleted, "retention"); err != nil {
			return err
		}
		e.auditSystem(ctx, ck.Tenant, "checkpoint.retention_delete", ck.ID, nil)
	}
	keepFrom, err := e.keepFrom(ctx, sb.Tenant, sb.ID)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	if keepFrom > 0 && keepFrom < oldestKept {
		oldestKept = keepFrom // not past what metering has yet to count (lifecycle.go)
	}
	if oldestKept > 1 {
		if err := e.log.Truncate(ctx, Stream(sb.ID), oldestKept); err != nil {
			return fmt.Errorf("retention: truncate %s below %d: %w", Stream(sb.ID), oldestKept, err)
		}
	}
	return nil
}
