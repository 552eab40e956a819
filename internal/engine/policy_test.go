package engine_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestRecoveryPolicies: strict checkpoints after every exec before it
// returns; fast checkpoints in the background every FastEvery execs, at the
// first quiet moment — not during a burst of execs, but once it ends; none
// never. It logs each policy's exec round trip (median of 9) back to back
// and, for none and fast, with 400 ms between execs (an agent's thinking),
// measured in the same run, for docs/benchmarks.md.
func TestRecoveryPolicies(t *testing.T) {
	// A burst here is 9 execs of well under a second each; the cut may wait
	// for its end up to a minute (the default is 2 s).
	defer engine.SetFastQuiet(150*time.Millisecond, time.Minute)()
	env := enginetest.NewFor(t, "gvisor", engine.Options{Recovery: engine.RecoveryOptions{FastEvery: 3, FastInterval: time.Hour}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "sometimes"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad policy: %v", err)
	}
	count := func(id string) int {
		cks, err := e.ListCheckpoints(ctx, "default", id, false)
		if err != nil {
			t.Fatal(err)
		}
		return len(cks)
	}
	medians := map[string]time.Duration{}
	for _, policy := range []string{"none", "fast", "strict"} {
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: policy, Cold: true})
		if err != nil {
			t.Fatal(err)
		}
		// Whether a cut ran at any moment of the burst, sampled.
		var cutDuring atomic.Bool
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stopSampling:
					return
				case <-time.After(2 * time.Millisecond):
				}
				if e.CutHeld(sb.ID) {
					cutDuring.Store(true)
				}
			}
		}()
		var took []time.Duration
		for i := 1; i <= 9; i++ {
			start := time.Now()
			if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo $$ >> /root/log"}}); err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
			if policy == "strict" && count(sb.ID) != i {
				t.Fatalf("strict: %d checkpoints after %d execs", count(sb.ID), i)
			}
		}
		close(stopSampling)
		<-sampled
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		medians[policy] = took[len(took)/2]
		switch policy {
		case "none":
			if n := count(sb.ID); n != 0 {
				t.Errorf("none: %d checkpoints", n)
			}
		case "fast":
			// 9 execs back to back, every 3rd due: none during the burst
			// (it never went quiet), then one (the others were skipped
			// while it waited).
			if cutDuring.Load() {
				t.Errorf("fast: a checkpoint cut the sandbox during a burst of execs")
			}
			deadline := time.Now().Add(time.Minute)
			for count(sb.ID) < 1 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := count(sb.ID); n != 1 {
				t.Errorf("fast: %d checkpoints after a burst of 9 execs, want 1", n)
			}
		}
		if policy != "strict" {
			// Paced like an agent: the cut falls between the calls.
			var paced []time.Duration
			for range 9 {
				time.Sleep(400 * time.Millisecond)
				start := time.Now()
				if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo $$ >> /root/log"}}); err != nil {
					t.Fatal(err)
				}
				paced = append(paced, time.Since(start))
			}
			sort.Slice(paced, func(i, j int) bool { return paced[i] < paced[j] })
			medians[policy+" paced"] = paced[len(paced)/2]
		}
		if err := e.Destroy(ctx, "default", sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("exec round trip p50: none %v, fast %v (%.2fx), strict %v (%.2fx); 400 ms apart: none %v, fast %v (%.2fx)",
		medians["none"].Round(time.Millisecond), medians["fast"].Round(time.Millisecond),
		float64(medians["fast"])/float64(medians["none"]),
		medians["strict"].Round(time.Millisecond), float64(medians["strict"])/float64(medians["none"]),
		medians["none paced"].Round(time.Millisecond), medians["fast paced"].Round(time.Millisecond),
		float64(medians["fast paced"])/float64(medians["none paced"]))
}

// TestFastReplayBudget: the fast policy's adaptive cut. Short execs far
// below FastEvery take no checkpoint; once the execs since the last one
// ran FastReplayBudget in all, one is taken, and the count starts again.
func TestFastReplayBudget(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{Recovery: engine.RecoveryOptions{
		FastEvery: 1000, FastInterval: time.Hour, FastReplayBudget: time.Second}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "fast", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		cks, err := e.ListCheckpoints(ctx, "default", sb.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		return len(cks)
	}
	run := func(args ...string) {
		if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: args}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		run("true")
	}
	time.Sleep(300 * time.Millisecond) // a checkpoint wrongly started would show by now
	if n := count(); n != 0 {
		t.Fatalf("%d checkpoints after 5 short execs (budget 1s, every 1000)", n)
	}
	run("sleep", "0.6")
	run("sleep", "0.6") // 1.2s since the last cut, with the short ones
	deadline := time.Now().Add(time.Minute)
	for count() < 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d checkpoints once the execs ran past the replay budget, want 1", n)
	}
	// The budget starts again from the cut.
	run("sleep", "0.3")
	time.Sleep(300 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("%d checkpoints after 0.3s more of execs, want still 1", n)
	}
}

// TestTenantPolicy: a tenant's policy gives its new sandboxes their
// recovery policy, its retention and its idle timeout, over the daemon's
// defaults (none of which are set here).
func TestTenantPolicy(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, bad := range []meta.TenantPolicy{{Recovery: "sometimes"}, {IdleTimeout: 10 * time.Millisecond}, {KeepCheckpoints: -1}, {FastReplayBudget: 10 * time.Millisecond}} {
		if err := e.SetTenantPolicy(ctx, "default", bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("policy %+v: %v", bad, err)
		}
	}
	if err := e.SetTenantPolicy(ctx, "nosuchtenant", meta.TenantPolicy{Recovery: "fast"}); !errdefs.IsNotFound(err) {
		t.Errorf("policy of a missing tenant: %v", err)
	}
	want := meta.TenantPolicy{Recovery: "strict", KeepCheckpoints: 1, IdleTimeout: 2 * time.Second}
	if err := e.SetTenantPolicy(ctx, "default", want); err != nil {
		t.Fatal(err)
	}
	if got, err := e.TenantPolicy(ctx, "default"); err != nil || got != want {
		t.Fatalf("policy read back: %+v %v", got, err)
	}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Policy != "strict" {
		t.Fatalf("a new sandbox's policy is %q, want the tenant's strict", sb.Policy)
	}
	for i := 0; i < 2; i++ {
		if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	// On local stores retention runs once a strict checkpoint's upload,
	// behind the exec's answer, ended (upload.go).
	e.WaitUploads()
	all, _ := e.ListCheckpoints(ctx, "default", sb.ID, true)
	kept, _ := e.ListCheckpoints(ctx, "default", sb.ID, false)
	if len(all) != 2 || len(kept) != 1 {
		t.Errorf("strict with keep 1: %d checkpoints made, %d kept; want 2 and 1", len(all), len(kept))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		cur, _ := env.Meta.Get(ctx, sb.ID)
		if cur.State == meta.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not stopped after the tenant's idle timeout: %+v", cur)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatalf("exec after the idle stop: %v", err)
	}
}

// TestTenantQuota: a tenant's sandbox count, memory and checkpoint-bytes
// quotas refuse what would pass them, with 429-kind errors naming the
// quota; a fork counts as a sandbox.
func TestTenantQuota(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.SetTenantQuota(ctx, "default", meta.TenantQuota{MaxSandboxes: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative quota: %v", err)
	}
	if err := e.SetTenantQuota(ctx, "default", meta.TenantQuota{MaxSandboxes: 2, MaxMemoryBytes: 3 << 28}); err != nil {
		t.Fatal(err)
	}
	mk := func(mem int64) (meta.Sandbox, error) {
		return e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true, Limits: sandbox.Limits{MemoryBytes: mem}})
	}
	a, err := mk(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mk(768 << 20); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max_memory_bytes") {
		t.Errorf("over the memory quota: %v", err)
	}
	if _, err := mk(256 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := mk(64 << 20); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max_sandboxes") {
		t.Errorf("over the sandbox quota: %v", err)
	}
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a fork over the sandbox quota: %v", err)
	}
	if err := e.SetTenantQuota(ctx, "default", meta.TenantQuota{MaxCheckpointBytes: ck.Stats.StoredBytes}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: a.ID}); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max_checkpoint_bytes") {
		t.Errorf("over the checkpoint quota: %v", err)
	}
	if err := e.SetTenantQuota(ctx, "default", meta.TenantQuota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mk(64 << 20); err != nil {
		t.Errorf("with the quota lifted: %v", err)
	}
}
