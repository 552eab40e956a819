package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// counterScript draws a random value inside the sandbox, keeps it only in
// a shell variable, and prints it with a counter every 50 ms: after a
// restore the value and the count continue; after a restart they do not.
const counterScript = `R=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); i=0; while :; do i=$((i+1)); echo "$R $i"; sleep 0.05; done`

type counterLine struct {
	r string
	n int
}

// lastLine reads the counter's last complete line from its log.
func lastLine(t *testing.T, e *engine.Engine, id string, pid int) counterLine {
	t.Helper()
	out, code := execOut(t, e, "default", id, "sh", "-c", fmt.Sprintf("tail -n 2 /run/amber/proc/%d.log | head -n 1", pid))
	f := strings.Fields(out)
	if code != 0 || len(f) != 2 {
		t.Fatalf("counter log: %q (exit %d)", out, code)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("counter log: %q", out)
	}
	return counterLine{f[0], n}
}

func startTicks(t *testing.T, e *engine.Engine, id string, pid int) uint64 {
	t.Helper()
	ps, err := e.Processes(ctxT(t), "default", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.PID == pid {
			return p.StartTicks
		}
	}
	t.Fatalf("process %d is not in %s: %+v", pid, id, ps)
	return 0
}

func fileState(t *testing.T, e *engine.Engine, id string) string {
	t.Helper()
	out, _ := execOut(t, e, "default", id, "sh", "-c", "cat /root/before 2>&1; cat /root/after 2>&1 || true")
	return out
}

// TestCheckpointRestoreFork goes through the engine with each driver: a
// checkpoint of a running sandbox, a second (incremental) one, a crash
// (Kill), a restore in place of the first, a fork of the second, a
// recover; each restore is checked by the in-memory counter (same random
// value, count continued), the process's start time and the files.
func TestCheckpointRestoreFork(t *testing.T) {
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) { testCheckpointRestoreFork(t, drv) })
	}
}

func testCheckpointRestoreFork(t *testing.T, drv string) {
	env := enginetest.NewFor(t, drv, engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	pid, err := e.StartProcess(ctx, "default", id, sandbox.ExecSpec{Args: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	// 8 MiB that stay the same between the two checkpoints (in a tmpfs:
	// memory for gVisor, a tmpfs image for CRIU).
	if out, code := execOut(t, e, "default", id, "sh", "-c",
		"echo before > /root/before && dd if=/dev/urandom of=/dev/shm/stable bs=1M count=8 2>&1"); code != 0 {
		t.Fatalf("setup: %s", out)
	}
	time.Sleep(300 * time.Millisecond)
	ticks := startTicks(t, e, id, pid)

	var phases []string
	ck1, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id, Tag: "first",
		Progress: func(p engine.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	at1 := lastLine(t, e, id, pid) // the counter ran on after the cut; at least this far at the cut
	t.Logf("checkpoint 1: %+v", ck1.Stats)
	if ck1.State != meta.CheckpointCommitted || ck1.Seq != 2 || ck1.EventSeq != 3 || ck1.Tag != "first" ||
		ck1.Stats.MemoryBytes <= 0 || ck1.Stats.StoredBytes <= 0 || ck1.ManifestDigest == "" || ck1.Driver != drv {
		t.Fatalf("checkpoint 1: %+v", ck1)
	}
	if strings.Join(phases, ",") != "cut,upload" {
		t.Errorf("progress phases: %v", phases)
	}

	execOut(t, e, "default", id, "sh", "-c", "echo after > /root/after")
	ck2, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint 2: %+v", ck2.Stats)
	if ck2.Parent != ck1.ID || ck2.Stats.NewChunks >= ck2.Stats.Chunks || ck2.Stats.StoredBytes > ck1.Stats.StoredBytes/2 {
		t.Errorf("second checkpoint is not incremental: %+v (first %+v)", ck2.Stats, ck1.Stats)
	}
	if cks, err := e.ListCheckpoints(ctx, "default", id, false); err != nil || len(cks) != 2 || cks[0].ID != ck1.ID {
		t.Fatalf("list: %+v %v", cks, err)
	}

	// Another tenant sees none of it.
	if _, err := e.GetCheckpoint(ctx, "other", ck1.ID); !errdefs.IsNotFound(err) {
		t.Errorf("other tenant get checkpoint: %v", err)
	}
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "other", Checkpoint: ck1.ID, AsNew: true}); !errdefs.IsNotFound(err) {
		t.Errorf("other tenant restore: %v", err)
	}
	if _, err := e.ListCheckpoints(ctx, "other", id, true); !errdefs.IsNotFound(err) {
		t.Errorf("other tenant list: %v", err)
	}

	// A crash, then back to the first cut.
	if _, err := e.Kill(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	rsb, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck1.ID})
	if err != nil {
		t.Fatal(err)
	}
	if rsb.ID != id || rsb.State != meta.StateRunning || rsb.Generation != 1 || rsb.Origin != ck1.ID {
		t.Fatalf("restored: %+v", rsb)
	}
	time.Sleep(200 * time.Millisecond)
	got := lastLine(t, e, id, pid)
	if got.r != at1.r || got.n <= 0 {
		t.Errorf("counter after restore: %+v; at the cut: %+v (a different random value means a restart)", got, at1)
	}
	if tk := startTicks(t, e, id, pid); tk != ticks {
		t.Errorf("process %d start ticks %d, before %d: restarted, not restored", pid, tk, ticks)
	}
	if fs := fileState(t, e, id); !strings.Contains(fs, "before") || strings.Contains(fs, "after\n") {
		t.Errorf("files after restoring the first cut: %q", fs)
	}
	time.Sleep(200 * time.Millisecond)
	if again := lastLine(t, e, id, pid); again.n <= got.n {
		t.Errorf("counter does not run after restore: %+v then %+v", got, again)
	}

	// A fork of the second cut while the original runs.
	// (criu: the fork gets a uid range of its own; the original holds
	// the image's.)
	fork, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck2.ID, AsNew: true})
	if err != nil {
		t.Fatalf("fork while the original runs: %v", err)
	}
	if fork.ID == id || fork.Origin != ck2.ID || fork.State != meta.StateRunning {
		t.Fatalf("fork: %+v", fork)
	}
	if fs := fileState(t, e, fork.ID); !strings.Contains(fs, "after\n") {
		t.Errorf("fork's files: %q", fs)
	}
	if fl := lastLine(t, e, fork.ID, pid); fl.r != at1.r {
		t.Errorf("fork's counter %+v, original's value %s", fl, at1.r)
	}
	if _, code := execOut(t, e, "default", id, "true"); code != 0 {
		t.Errorf("the original stopped working after the fork")
	}
	// A fork without checkpoints of its own recovers from its origin.
	if _, err := e.Kill(ctx, "default", fork.ID); err != nil {
		t.Fatal(err)
	}
	if fr, err := e.Recover(ctx, "default", fork.ID, nil); err != nil || fr.Origin != ck2.ID {
		t.Errorf("recover fork: %+v %v", fr, err)
	}

	// Recover uses the latest checkpoint (the second).
	if _, err := e.Kill(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	rsb, err = e.Recover(ctx, "default", id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rsb.Generation != 2 || rsb.Origin != ck2.ID {
		t.Fatalf("recovered: %+v", rsb)
	}
	if fs := fileState(t, e, id); !strings.Contains(fs, "after\n") {
		t.Errorf("files after recover: %q", fs)
	}
	if got := lastLine(t, e, id, pid); got.r != at1.r {
		t.Errorf("counter after recover: %+v", got)
	}

	// "Restore to event N": the newest checkpoint cut at or before it.
	if _, err := e.RecoverTo(ctx, "default", id, ck1.Seq-1, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("recover to an event before any cut: %v", err)
	}

	// The log tells the story, one event per incarnation, with the
	// fidelity report of each restore.
	evs, err := e.Events(ctx, "default", id, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Type == engine.EventCheckpointed && ev.CheckpointRef == "" {
			t.Errorf("checkpoint event %d has no checkpoint reference", ev.Seq)
		}
		if ev.Type == engine.EventRestored && !strings.Contains(string(ev.Payload), `"processes":`) {
			t.Errorf("restore event without a fidelity report: %s", ev.Payload)
		}
	}
	want := "sandbox.created,sandbox.started,sandbox.checkpointed,sandbox.checkpointed,sandbox.killed,sandbox.restored,sandbox.killed,sandbox.restored"
	if strings.Join(types, ",") != want {
		t.Errorf("events:\n got %s\nwant %s", strings.Join(types, ","), want)
	}
	rsb, err = e.RecoverTo(ctx, "default", id, ck2.Seq-1, nil)
	if err != nil || rsb.Origin != ck1.ID {
		t.Fatalf("recover to event %d: %+v %v (want %s)", ck2.Seq-1, rsb, err, ck1.ID)
	}
	if fs := fileState(t, e, id); strings.Contains(fs, "after\n") {
		t.Errorf("files after recovering to event %d: %q", ck2.Seq-1, fs)
	}
}

// TestCheckpointCommitFailures injects a failure at each step of the
// commit, a stale lease, a crash between intent and commit, and a damaged
// chunk: no failed checkpoint is ever visible, and a damaged one never runs.
func TestCheckpointCommitFailures(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{Cluster: engine.ClusterOptions{LeaseTTL: 200 * time.Millisecond}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	pointer := func(ck string) bool {
		_, err := os.Stat(filepath.Join(env.Blobs, "objects/tenants/default/checkpoints", ck, "COMMITTED"))
		return err == nil
	}
	injected := errors.New("injected failure")
	for _, step := range []string{"chunks", "manifest", "publish"} {
		env.FailAt = func(s string) error {
			if s == step {
				return injected
			}
			return nil
		}
		ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
		if !errors.Is(err, injected) {
			t.Fatalf("failure at %s: %v", step, err)
		}
		if row, _ := env.Meta.Checkpoint(ctx, ck.ID); row.State != meta.CheckpointFailed || pointer(ck.ID) {
			t.Errorf("failure at %s: row %s, pointer %v", step, row.State, pointer(ck.ID))
		}
	}
	// What the failed checkpoints stored is collected: no checkpoint is
	// committed yet, so no chunk may stay.
	for deadline := time.Now().Add(time.Minute); ; {
		chunks, _ := filepath.Glob(filepath.Join(env.Blobs, "objects/tenants/default/packs/*/*"))
		if len(chunks) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d chunks of failed checkpoints are still stored after a minute", len(chunks))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A failure after the pointer and the log event: the checkpoint counts.
	env.FailAt = func(s string) error {
		if s == "committed" {
			return injected
		}
		return nil
	}
	ckc, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil || ckc.State != meta.CheckpointCommitted || !pointer(ckc.ID) {
		t.Fatalf("failure after commit: %+v %v", ckc, err)
	}
	env.FailAt = nil
	if cks, _ := e.ListCheckpoints(ctx, "default", id, false); len(cks) != 1 {
		t.Fatalf("visible checkpoints: %+v", cks)
	}
	if _, code := execOut(t, e, "default", id, "true"); code != 0 {
		t.Fatal("sandbox does not run after the failed checkpoints")
	}

	// Another node takes the stream once this engine's lease lapsed: the
	// next checkpoint is fenced and invisible, and no restore happens.
	time.Sleep(400 * time.Millisecond)
	if _, err := env.Log.Acquire(ctx, engine.Stream(id), "node/other", time.Minute); err != nil {
		t.Fatal(err)
	}
	ckf, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if !errdefs.IsFenced(err) || pointer(ckf.ID) {
		t.Fatalf("stale lease: %v, pointer %v", err, pointer(ckf.ID))
	}
	if _, err := e.Recover(ctx, "default", id, nil); !errdefs.IsFenced(err) {
		t.Fatalf("recover while fenced: %v", err)
	}
	if cur, _ := env.Meta.Get(ctx, id); cur.State != meta.StateRunning {
		t.Fatalf("a fenced restore touched the sandbox: %+v", cur)
	}

	// A crash between intent and commit: the next start fails the row.
	if _, err := env.Meta.InsertCheckpoint(ctx, meta.Checkpoint{ID: "ckpt-crashed", Tenant: "default", SandboxID: id,
		State: meta.CheckpointPending, Stream: engine.Stream(id), Driver: "gvisor"}); err != nil {
		t.Fatal(err)
	}
	env.Restart(t)
	e = env.Engine
	if row, _ := env.Meta.Checkpoint(ctx, "ckpt-crashed"); row.State != meta.CheckpointFailed {
		t.Fatalf("pending checkpoint after restart: %+v", row)
	}

	// A damaged chunk is found before anything runs.
	chunks, _ := filepath.Glob(filepath.Join(env.Blobs, "objects/tenants/default/packs/*/*"))
	if len(chunks) == 0 {
		t.Fatal("no chunks stored")
	}
	for _, c := range chunks {
		b, err := os.ReadFile(c)
		if os.IsNotExist(err) {
			continue // garbage of the failed checkpoints, collected meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(c, b, 0o600); os.IsNotExist(err) {
			continue // collected (with its directory) between the read and the write
		} else if err != nil {
			t.Fatal(err)
		}
	}
	before, _ := e.List(ctx, "default")
	// From the chunk store: the node's hot copy (hottier.go) is not what
	// is damaged here.
	e.WaitHotTier()
	e.DropHotCopy(ckc.ID)
	_, err = e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ckc.ID, AsNew: true})
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("restore of a damaged checkpoint: %v", err)
	}
	t.Logf("damaged checkpoint refused: %v", err)
	if after, _ := e.List(ctx, "default"); len(after) != len(before) {
		t.Errorf("a damaged restore left a sandbox: %d → %d", len(before), len(after))
	}
	var _ eventlog.Lease
}

// TestCheckpointRetention keeps the newest two checkpoints and the tagged
// one, deletes the rest from the store, and truncates the log below the
// oldest one kept — but never below what usage metering has yet to count
// (checkpoints are counted from the log).
func TestCheckpointRetention(t *testing.T) {
	// Metering's loop idles; the test closes intervals by hand.
	env := enginetest.NewFor(t, "gvisor", engine.Options{MeterInterval: 24 * time.Hour, Recovery: engine.RecoveryOptions{KeepCheckpoints: 2}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	first := func(id string) uint64 {
		t.Helper()
		b, err := env.Log.Bounds(ctx, engine.Stream(id))
		if err != nil {
			t.Fatal(err)
		}
		return b.First
	}
	// Nothing metered yet: retention deletes checkpoints but keeps their
	// events until an interval has counted them.
	sb2, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb2.ID}); err != nil {
			t.Fatal(err)
		}
	}
	if f := first(sb2.ID); f != 1 {
		t.Errorf("the log of %s was truncated to %d before metering counted its checkpoints", sb2.ID, f)
	}
	if err := e.MeterTick(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb2.ID}); err != nil {
		t.Fatal(err)
	}
	if f := first(sb2.ID); f == 1 {
		t.Errorf("the log of %s was not truncated once metering had counted", sb2.ID)
	}
	var ids []string
	for i, tag := range []string{"", "keep-me", "", "", ""} {
		if err := e.MeterTick(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID, Tag: tag})
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		ids = append(ids, ck.ID)
	}
	cks, err := e.ListCheckpoints(ctx, "default", sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, ck := range cks {
		kept = append(kept, ck.ID)
	}
	want := []string{ids[1], ids[3], ids[4]}
	if strings.Join(kept, ",") != strings.Join(want, ",") {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	for i, id := range ids {
		_, err := os.Stat(filepath.Join(env.Blobs, "objects/tenants/default/checkpoints", id, "COMMITTED"))
		if gone := os.IsNotExist(err); gone != (i == 0 || i == 2) {
			t.Errorf("checkpoint %d (%s): pointer gone %v", i, id, gone)
		}
	}
	tagged, _ := e.GetCheckpoint(ctx, "default", ids[1])
	b, err := env.Log.Bounds(ctx, engine.Stream(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	if b.First != tagged.EventSeq {
		t.Errorf("log starts at %d, want the tagged checkpoint's event %d", b.First, tagged.EventSeq)
	}
	evs, err := e.Events(ctx, "default", sb.ID, 1, 100)
	if err != nil || len(evs) == 0 || evs[0].Seq != b.First || evs[0].CheckpointRef != ids[1] {
		t.Fatalf("events after truncation: %v %v", evs, err)
	}
	// The oldest kept checkpoint still restores.
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ids[1]}); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreAfterHalfRestore: a restore in place that failed half-way (or
// died with its daemon) leaves the row "restoring", maybe with the sandbox
// running; a later Recover restores it again instead of refusing it as
// busy (chaos seed 4015 ended needs-reconciliation on that refusal).
func TestRestoreAfterHalfRestore(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo cut > /tmp/at"}}); err != nil {
		t.Fatal(err)
	}
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo later > /tmp/at"}}); err != nil {
		t.Fatal(err)
	}
	// The sandbox still runs; its row says a restore was under way.
	if _, err := env.Meta.SetState(ctx, sb.ID, meta.StateRestoring, "restoring from "+ck.ID, meta.StateRunning); err != nil {
		t.Fatal(err)
	}
	got, err := e.Recover(ctx, "default", sb.ID, nil)
	if err != nil {
		t.Fatalf("recover a sandbox left restoring: %v", err)
	}
	if got.State != meta.StateRunning || got.Origin != ck.ID {
		t.Fatalf("after recover: %s from %s, want running from %s", got.State, got.Origin, ck.ID)
	}
	var out bytes.Buffer
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"cat", "/tmp/at"}, Stdout: &out}); err != nil || strings.TrimSpace(out.String()) != "cut" {
		t.Fatalf("/tmp/at after recover: %q %v, want \"cut\"", out.String(), err)
	}
}
