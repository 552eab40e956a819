package engine

// Local commit, upload behind: the strict policy on a node whose stores
// are its own (not Options.Cluster.Shared) acknowledges an exec once its
// checkpoint is durable on the node, and uploads it after.
//
// The order and what a crash at each step leaves: "Strict on local stores"
// at the top of checkpoint.go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
)

// The failpoints of the local commit (Options.Failpoints).
const (
	// FPLocalKept: the hot copy is durable, the row not yet committed.
	FPLocalKept = "checkpoint.local-kept"
	// FPUpload: before a background upload begins; an armed point ends
	// the upload as a crash would (the row stays pending upload).
	FPUpload = "checkpoint.upload"
)

// uploads is the queue of uploads behind local commits, one worker per
// sandbox.
type uploads struct {
	mu      sync.Mutex
	queue   map[string][]meta.Checkpoint // sandbox id → checkpoints, oldest first
	running map[string]bool
	wg      sync.WaitGroup
}

// commitLocal is steps 3–4 of the order above for ck, cut into dir. It
// reports false, having touched nothing but the template's push (step 0,
// which the intent left to the upload), when the hot tier cannot keep the
// image (the caller then uploads before the ack); once true, dir is the
// hot copy's.
//
// cs, dumped and start are the cut's figures.
func (e *checkpointer) commitLocal(ctx context.Context, ck meta.Checkpoint, sb meta.Sandbox, dir string, pm map[string]string,
	payload CheckpointedPayload, cs sandbox.CheckpointStats, dumped time.Duration, start time.Time) (meta.Checkpoint, bool, error) {
	rec, kept, err := e.ck.hot.keepLocal(ck, dir, pm)
	if err == nil && !kept {
		err = e.templatePushed(ctx, ck) // uploaded before the ack: its template first
	}
	if err != nil || !kept {
		return ck, false, err
	}
	undo := func(err error) (meta.Checkpoint, bool, error) {
		e.ck.hot.drop(ck.ID)
		return ck, true, err
	}
	if err := e.ck.fps.Eval(FPLocalKept); err != nil {
		return undo(err)
	}
	// The lease, the log event and the row are retried through a store
	// error window (storeRetry): the cut is made, and giving up here
	// threw it away for the session's next attempt to make again.
	ev := eventWithID(sb, ck.ID+".checkpointed", EventCheckpointed, payload)
	ev.CheckpointRef = ck.ID
	var ar eventlog.AppendResult
	err = e.storeRetry(ctx, "record checkpoint in the log", func(ctx context.Context) error {
		l, err := e.holdLease(ctx, sb.ID)
		if err != nil {
			return err
		}
		ar, err = e.log.Append(ctx, Stream(sb.ID), l.Epoch, eventlog.Any, ev) // idempotent: by the event's id
		return err
	})
	if err != nil {
		return undo(fmt.Errorf("record checkpoint in the log: %w", err))
	}
	ck.EventSeq, ck.UploadPending, ck.HotDigest = ar.Last, true, rec
	ck.Stats = meta.CheckpointStats{FrozenNS: int64(cs.Frozen), DumpNS: int64(dumped), TotalNS: int64(time.Since(start)),
		MemoryBytes: cs.MemoryBytes, LayerBytes: cs.LayerBytes}
	if ck, err = e.commitRow(ctx, ck); err != nil {
		return undo(err) // the next start fails the pending row
	}
	e.enqueueUpload(ck)
	e.lg.InfoContext(ctx, "checkpoint committed on the node; its upload follows", "sandbox_id", sb.ID, "checkpoint_id", ck.ID,
		"frozen", cs.Frozen.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
	return ck, true, nil
}

// enqueueUpload queues ck's upload behind its sandbox's earlier ones.
func (e *checkpointer) enqueueUpload(ck meta.Checkpoint) {
	u := &e.ck.up
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.queue == nil {
		u.queue, u.running = map[string][]meta.Checkpoint{}, map[string]bool{}
	}
	u.queue[ck.SandboxID] = append(u.queue[ck.SandboxID], ck)
	if u.running[ck.SandboxID] || e.bg.ctx == nil {
		return
	}
	u.running[ck.SandboxID] = true
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			u.mu.Lock()
			q := u.queue[ck.SandboxID]
			if len(q) == 0 || e.bg.ctx.Err() != nil {
				delete(u.running, ck.SandboxID)
				u.mu.Unlock()
				return
			}
			next := q[0]
			u.queue[ck.SandboxID] = q[1:]
			u.mu.Unlock()
			e.uploadWithRetry(e.bg.ctx, next)
		}
	}()
}

// waitUploads waits for the upload workers (Close, after the background
// context ended; tests).
func (e *checkpointer) waitUploads() { e.ck.up.wg.Wait() }

// uploadWithRetry uploads ck, again with backoff while the store fails,
// until ctx ends (the row stays pending upload: the next start resumes).
func (e *checkpointer) uploadWithRetry(ctx context.Context, ck meta.Checkpoint) {
	wait := 100 * time.Millisecond
	for {
		err := e.upload(ctx, ck)
		if err == nil || ctx.Err() != nil || errors.Is(err, errUploadAbandoned) {
			return
		}
		e.lg.Warn("checkpoint upload failed; trying again", "checkpoint_id", ck.ID, "sandbox_id", ck.SandboxID, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// errUploadAbandoned: FPUpload fired (a simulated crash).
var errUploadAbandoned = errors.New("upload abandoned")

// upload is step 6 of the order above.
func (e *checkpointer) upload(ctx context.Context, ck meta.Checkpoint) error {
	if err := e.ck.fps.Eval(FPUpload); err != nil {
		return fmt.Errorf("%w: %v", errUploadAbandoned, err)
	}
	cur, err := e.meta.Checkpoint(ctx, ck.ID)
	if err != nil {
		return err
	}
	if cur.State != meta.CheckpointCommitted || !cur.UploadPending {
		e.ck.hot.unpin(ck.ID) // deleted or settled meanwhile
		return nil
	}
	start := time.Now()
	if err := e.templatePushed(ctx, cur); err != nil { // step 0, behind the local commit
		return err
	}
	dir, _, err := e.ck.hot.take(cur, e.ck.workDir, nil)
	if err != nil {
		return e.uploadLost(ctx, cur, err)
	}
	defer os.RemoveAll(dir)
	pm := e.ck.hot.metaOf(cur.ID)
	res, err := e.ck.store.Put(ctx, cur.Tenant, cur.ID, dir, chunkstore.PutOptions{Parent: cur.Parent, Meta: pm, Unchanged: isLayerBlob})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		// An earlier attempt published it and stopped before the row.
		info, serr := e.ck.store.Stat(ctx, cur.Tenant, cur.ID)
		m, merr := e.ck.store.Manifest(ctx, cur.Tenant, cur.ID)
		if serr != nil || merr != nil {
			return errors.Join(err, serr, merr)
		}
		res = chunkstore.PutResult{Info: info, ImageDigest: m.ImageDigest, Size: m.Size}
		res.ManifestDigest = info.ManifestDigest
	} else if err != nil {
		return err
	}
	cur.ManifestDigest, cur.ImageDigest = res.ManifestDigest, res.ImageDigest
	cur.Stats.UploadNS, cur.Stats.ImageBytes, cur.Stats.StoredBytes = int64(time.Since(start)), res.Size, res.StoredBytes
	cur.Stats.Chunks, cur.Stats.NewChunks = res.Chunks, res.NewChunks
	if _, err := e.meta.FinishUpload(ctx, cur); err != nil {
		return err
	}
	e.ck.hot.unpin(cur.ID)
	e.lg.Info("checkpoint uploaded", "checkpoint_id", cur.ID, "sandbox_id", cur.SandboxID, "upload", time.Since(start).Round(time.Millisecond),
		"stored_bytes", res.StoredBytes, "new_chunks", res.NewChunks, "reused_files", res.ReusedFiles)
	if sb, err := e.meta.Get(ctx, cur.SandboxID); err == nil {
		if err := e.retain(ctx, sb); err != nil {
			e.lg.Warn("retention", "err", err)
		}
	}
	return nil
}

// uploadLost fails checkpoint ck, whose hot copy was lost or damaged
// before its upload ended (why): no copy of its image exists.
func (e *checkpointer) uploadLost(ctx context.Context, ck meta.Checkpoint, why error) error {
	e.ck.hot.drop(ck.ID)
	reason := fmt.Sprintf("its image was lost before its upload: %v", why)
	if _, err := e.meta.SetCheckpointState(context.WithoutCancel(ctx), ck.ID, meta.CheckpointFailed, reason, meta.CheckpointCommitted); err != nil {
		return err
	}
	e.lg.Error("checkpoint failed: its hot copy was lost before its upload", "checkpoint_id", ck.ID, "sandbox_id", ck.SandboxID, "err", why)
	e.auditSystem(ctx, ck.Tenant, "checkpoint.upload_lost", ck.ID, why)
	e.collect(ck.Tenant)
	return nil
}

// reconcileUploads pins the hot copies of the committed checkpoints a
// previous daemon left with their upload pending and queues their uploads.
func (e *checkpointer) reconcileUploads(ctx context.Context) error {
	cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{States: []meta.CheckpointState{meta.CheckpointCommitted}})
	if err != nil {
		return fmt.Errorf("reconcile uploads: %w", err)
	}
	for _, ck := range cks {
		if !ck.UploadPending {
			continue
		}
		if e.lease.shared || e.ck.store == nil {
			e.lg.Warn("checkpoint upload pending left alone: this node's stores are shared or absent", "checkpoint_id", ck.ID)
			continue
		}
		e.ck.hot.pin(ck.ID)
		e.enqueueUpload(ck)
	}
	return nil
}

// usableLocal reports whether ck, committed with its upload pending, still
// has a hot copy that matches its record; one that does not is failed
// (uploadLost). Any other checkpoint is usable.
func (e *checkpointer) usableLocal(ctx context.Context, ck meta.Checkpoint) bool {
	if !ck.UploadPending || ck.State != meta.CheckpointCommitted {
		return true
	}
	dir, _, err := e.ck.hot.take(ck, e.ck.workDir, nil)
	if err == nil {
		os.RemoveAll(dir)
		return true
	}
	if lerr := e.uploadLost(ctx, ck, err); lerr != nil {
		e.lg.Error("record lost checkpoint", "checkpoint_id", ck.ID, "err", lerr)
	}
	return false
}

// lostAfter names sandbox ck.SandboxID's checkpoints cut after ck whose
// image was lost before their upload (the restored event's report).
func (e *checkpointer) lostAfter(ctx context.Context, ck meta.Checkpoint) []string {
	cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{SandboxID: ck.SandboxID, States: []meta.CheckpointState{meta.CheckpointFailed}})
	if err != nil {
		return nil
	}
	var out []string
	for _, c := range cks {
		if c.UploadPending && c.EventSeq > ck.EventSeq {
			out = append(out, c.ID)
		}
	}
	return out
}
