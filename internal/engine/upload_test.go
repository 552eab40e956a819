package engine_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// TestStrictUploadBehind: on local stores a strict exec is acknowledged
// once its checkpoint is committed on the node; the upload follows and
// clears the mark. It logs, for each driver, the exec p50 (median of 9)
// in a sandbox holding 64 MiB of incompressible files with no policy,
// strict with the upload before the ack, strict with it after (execs back
// to back, so an upload overlaps the next exec's cut; and with each upload
// done before the next exec), and the driver's own checkpoint time, all in
// one run (docs/benchmarks.md).
func TestStrictUploadBehind(t *testing.T) {
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) {
			env := enginetest.NewFor(t, drv, engine.Options{})
			e := env.Engine
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			medians := map[string]time.Duration{}
			var dumps []time.Duration
			for _, mode := range []string{"none", "strict-upload-first", "strict-upload-behind", "strict-upload-behind-idle"} {
				policy := "strict"
				if mode == "none" {
					policy = "none"
				}
				e.SetStrictUploadFirst(mode == "strict-upload-first")
				sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "none", Cold: true})
				if err != nil {
					t.Fatal(err)
				}
				if _, code := execOut(t, e, "default", sb.ID, "sh", "-c", "head -c 67108864 /dev/urandom > /root/fill"); code != 0 {
					t.Fatal("fill")
				}
				if policy == "strict" {
					// The policy of a running sandbox: its row (what
					// afterExec reads).
					if _, err := env.Meta.SetPolicy(ctx, sb.ID, policy); err != nil {
						t.Fatal(err)
					}
				}
				var took []time.Duration
				for i := 1; i <= 9; i++ {
					start := time.Now()
					if _, code := execOut(t, e, "default", sb.ID, "sh", "-c", "echo $$ >> /root/log"); code != 0 {
						t.Fatal("exec")
					}
					took = append(took, time.Since(start))
					if mode == "strict-upload-behind-idle" {
						e.WaitUploads() // the next call comes once the upload is done
					}
				}
				sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
				medians[mode] = took[len(took)/2]
				e.WaitUploads()
				cks, err := e.ListCheckpoints(ctx, "default", sb.ID, false)
				if err != nil {
					t.Fatal(err)
				}
				if policy == "strict" && len(cks) != 9 {
					t.Fatalf("%s: %d checkpoints after 9 execs", mode, len(cks))
				}
				for _, ck := range cks {
					if ck.UploadPending || ck.ManifestDigest == "" || ck.ImageDigest == "" {
						t.Fatalf("%s: checkpoint not uploaded: %+v", mode, ck)
					}
					dumps = append(dumps, time.Duration(ck.Stats.DumpNS))
				}
				if err := e.Destroy(ctx, "default", sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			e.SetStrictUploadFirst(false)
			sort.Slice(dumps, func(i, j int) bool { return dumps[i] < dumps[j] })
			t.Logf("%s, 64 MiB: exec p50 none %v, strict upload before the ack %v, strict upload after the ack %v back to back, %v when the upload ends before the next exec; driver checkpoint p50 %v",
				drv, medians["none"].Round(time.Millisecond), medians["strict-upload-first"].Round(time.Millisecond),
				medians["strict-upload-behind"].Round(time.Millisecond), medians["strict-upload-behind-idle"].Round(time.Millisecond),
				dumps[len(dumps)/2].Round(time.Millisecond))
		})
	}
}

// TestUploadBehindCrashes injects crashes around the local commit.
func TestUploadBehindCrashes(t *testing.T) {
	fps := failpoint.New()
	env := enginetest.NewFor(t, "gvisor", engine.Options{Failpoints: fps})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "strict", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	pointer := func(ck string) bool {
		_, err := os.Stat(filepath.Join(env.Blobs, "objects/tenants/default/checkpoints", ck, "COMMITTED"))
		return err == nil
	}
	newest := func() meta.Checkpoint {
		cks, err := e.ListCheckpoints(ctx, "default", id, true)
		if err != nil || len(cks) == 0 {
			t.Fatalf("checkpoints: %v %v", cks, err)
		}
		return cks[len(cks)-1]
	}
	row := func(ck string) meta.Checkpoint {
		r, err := env.Meta.Checkpoint(ctx, ck)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// A crash before the local commit: the exec's checkpoint fails, its
	// row is failed and no copy stays.
	fps.Arm(engine.FPLocalKept, 1, failpoint.ErrCrash)
	if _, err := e.Exec(ctx, "default", id, sandbox.ExecSpec{Args: []string{"true"}}); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("exec with a crash before the local commit: %v", err)
	}
	fps.Disarm(engine.FPLocalKept)
	ck0 := newest()
	if ck0.State != meta.CheckpointFailed {
		t.Fatalf("crash before the local commit: %+v", ck0)
	}
	if _, whole := e.HotCopy(ck0.ID); whole {
		t.Fatal("a failed checkpoint kept its hot copy")
	}

	// A crash after the local commit, before the upload: committed, its
	// upload pending; a restore on this node uses the hot copy.
	fps.Arm(engine.FPUpload, 1, failpoint.ErrCrash)
	if out, _ := execOut(t, e, "default", id, "sh", "-c", "echo one > /root/a; cat /root/a"); out != "one\n" {
		t.Fatalf("exec: %q", out)
	}
	e.WaitUploads()
	ck1 := newest()
	if ck1.State != meta.CheckpointCommitted || !ck1.UploadPending || ck1.HotDigest == "" || pointer(ck1.ID) {
		t.Fatalf("after the local commit: %+v pointer %v", ck1, pointer(ck1.ID))
	}
	if err := e.DeleteCheckpoint(ctx, "default", ck1.ID); err == nil {
		t.Fatal("a checkpoint whose upload is pending was deleted")
	}
	fps.Disarm(engine.FPUpload)
	fps.Arm(engine.FPUpload, 1, failpoint.ErrCrash) // the recover's own exec-free path uploads nothing
	if _, err := e.Recover(ctx, "default", id, nil); err != nil {
		t.Fatalf("recover from a checkpoint whose upload is pending: %v", err)
	}
	if p, err := lastRestored(ctx, e, id); err != nil || !p.Hot || p.Checkpoint != ck1.ID {
		t.Fatalf("restored: %+v %v", p, err)
	}
	if out, _ := execOut(t, e, "default", id, "cat", "/root/a"); out != "one\n" {
		t.Fatalf("after recover: %q", out)
	}
	// The exec above committed a second checkpoint, its upload pending
	// too: both copies stay.
	e.WaitUploads()
	ck2 := newest()
	if !ck2.UploadPending || ck2.ID == ck1.ID {
		t.Fatalf("second checkpoint: %+v", ck2)
	}
	for _, ck := range []string{ck1.ID, ck2.ID} {
		if _, whole := e.HotCopy(ck); !whole {
			t.Fatalf("hot copy of %s, upload pending, is gone", ck)
		}
	}

	// Damage ck2's copy, restart: the start uploads ck1 from its copy and
	// fails ck2.
	dir, _ := e.HotCopy(ck2.ID)
	damaged := false
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() != "hot.json" && !damaged {
			f, ferr := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if ferr == nil {
				f.Write([]byte("x"))
				f.Close()
				damaged = true
			}
		}
		return nil
	})
	if !damaged {
		t.Fatal("no file to damage in the hot copy")
	}
	fps.Disarm(engine.FPUpload)
	env.Restart(t)
	e = env.Engine
	e.WaitUploads()
	if r := row(ck1.ID); r.State != meta.CheckpointCommitted || r.UploadPending || r.ManifestDigest == "" || !pointer(ck1.ID) {
		t.Fatalf("ck1 after the restart: %+v pointer %v", r, pointer(ck1.ID))
	}
	if r := row(ck2.ID); r.State != meta.CheckpointFailed || !strings.Contains(r.Reason, "lost before its upload") || pointer(ck2.ID) {
		t.Fatalf("ck2 after the restart: %+v", r)
	}
	// A restore to ck2's event falls back to ck1, and says so.
	if _, err := e.RecoverTo(ctx, "default", id, ck2.Seq, nil); err != nil {
		t.Fatal(err)
	}
	p, err := lastRestored(ctx, e, id)
	if err != nil || p.Checkpoint != ck1.ID || !slices.Contains(p.LostCheckpoints, ck2.ID) {
		t.Fatalf("restored: %+v %v", p, err)
	}
	// The fidelity report's list of what did not come back names it too.
	if i := slices.IndexFunc(p.NotRestored, func(l sandbox.Loss) bool { return l.Kind == sandbox.LossCheckpoints }); i < 0 ||
		!strings.Contains(p.NotRestored[i].Detail, ck2.ID) {
		t.Fatalf("restored: not_restored %+v, want the lost checkpoint %s", p.NotRestored, ck2.ID)
	}
	if out, _ := execOut(t, e, "default", id, "cat", "/root/a"); out != "one\n" {
		t.Fatalf("after the fallback: %q", out)
	}
	e.WaitUploads()
	if r := newest(); r.State != meta.CheckpointCommitted || r.UploadPending || !pointer(r.ID) {
		t.Fatalf("a strict checkpoint after the restart: %+v", r)
	}
}
