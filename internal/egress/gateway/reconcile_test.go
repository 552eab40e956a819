package gateway_test

import (
	"context"
	"errors"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/lib/failpoint"
)

// TestReconcile: an at-most-once charge cut off by a crash after its intent
// needs reconciliation (the re-run is answered 502, the shop is not
// charged again). Reconcile refuses what it must (no run, unknown key, a
// key with an outcome, a bad status, no note), then records the operator's
// finding; from then on the re-run is answered with it from the journal
// and the shop is still never contacted for that step again.
func TestReconcile(t *testing.T) {
	ctx := context.Background()
	led := newLedger(t, false)
	target := led.addr().String()
	policy := allowLoopback(led.addr())
	policy.Modes = []gateway.ModeRule{{Dest: target, Mode: gateway.ModeAtMostOnce}}
	path := storePath(t)
	const sb, cut = "sb-rec", "ckpt-0"

	// First life: the gateway dies after step 2's intent, before sending.
	store := openStore(t, path)
	fp := failpoint.New()
	fp.Arm(gateway.FPBeforeSend, 2, failpoint.ErrCrash)
	gw1 := gateway.New(gateway.Options{Failpoints: fp, Logger: quietLog, Journal: gateway.NewJournal(store)})
	if err := gw1.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: sb, ID: cut, Epoch: acquire(t, store, sb, "node-a"), Policy: policy}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw1, led.addr(), sb)
	if _, crashed := runProgram(f, target); crashed != 2 {
		t.Fatalf("program crashed at step %d, want 2", crashed)
	}
	gw1.Close()
	store.Close()

	// Second life: step 2 needs reconciliation.
	store = openStore(t, path)
	defer store.Close()
	j := gateway.NewJournal(store)
	gw2 := gateway.New(gateway.Options{Logger: quietLog, Journal: j})
	defer gw2.Close()
	if _, err := gw2.Reconcile(ctx, sb, gateway.Resolution{Key: "x", Status: 200, Note: "n"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("reconcile without a run: %v, want failed precondition", err)
	}
	run := gateway.Run{Tenant: "acme", Sandbox: sb, ID: cut, Epoch: acquire(t, store, sb, "node-a"), Policy: policy}
	if err := gw2.StartRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	f.setGateway(gw2)
	answered, _ := runProgram(f, target)
	if answered[2] != 502 {
		t.Fatalf("re-run of step 2 answered %d, want 502 (needs reconciliation)", answered[2])
	}
	recon, err := j.Reconciliations(ctx, sb)
	if err != nil || len(recon) != 1 || recon[0].Intent == nil || recon[0].Intent.Slot != 2 {
		t.Fatalf("reconciliations: %+v %v", recon, err)
	}
	key := recon[0].Intent.Key
	charges, before, _ := led.snapshot()
	if charges[2] != 0 {
		t.Fatalf("step 2 charged %d times before reconciliation", charges[2])
	}

	var step1 string
	for _, ev := range readStream(t, store, gateway.Stream(sb)) {
		var p gateway.IntentPayload
		if ev.Type == gateway.EventIntent && jsonUnmarshal(ev.Payload, &p) == nil && p.Slot == 1 {
			step1 = p.Key
		}
	}
	for _, c := range []struct {
		name string
		r    gateway.Resolution
		is   func(error) bool
	}{
		{"unknown key", gateway.Resolution{Key: "nope", Status: 200, Note: "n"}, errdefs.IsNotFound},
		{"a key with an outcome", gateway.Resolution{Key: step1, Status: 200, Note: "n"}, errdefs.IsConflict},
		{"status 42", gateway.Resolution{Key: key, Status: 42, Note: "n"}, errdefs.IsInvalidArgument},
		{"no note", gateway.Resolution{Key: key, Status: 200, Note: " "}, errdefs.IsInvalidArgument},
	} {
		if _, err := gw2.Reconcile(ctx, sb, c.r); !c.is(err) {
			t.Errorf("reconcile %s: %v", c.name, err)
		}
	}

	// The operator found the charge did not go through, and tells the
	// agent so: 409 with a body.
	e, err := gw2.Reconcile(ctx, sb, gateway.Resolution{Key: key, Status: 409, Body: []byte(`{"charged":false}`), Note: "not in the shop's ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Outcome == nil || e.Outcome.Status != 409 || e.Outcome.Reconciled != "not in the shop's ledger" {
		t.Fatalf("reconciled entry: %+v", e.Outcome)
	}
	if _, err := gw2.Reconcile(ctx, sb, gateway.Resolution{Key: key, Status: 200, Note: "again"}); !errdefs.IsConflict(err) {
		t.Fatalf("second reconcile: %v, want conflict", err)
	}

	// A re-run from the cut: step 2 is answered from the journal.
	if err := gw2.StartRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	for step := 1; step <= 2; step++ {
		status, body, err := charge(c, target, step)
		if err != nil {
			t.Fatal(err)
		}
		if step == 2 && (status != 409 || body != `{"charged":false}`) {
			t.Fatalf("step 2 after reconciliation: %d %q, want 409 and the recorded body", status, body)
		}
	}
	charges, after, _ := led.snapshot()
	if charges[2] != 0 || after[2] != before[2] {
		t.Fatalf("step 2 reached the shop after reconciliation: charges %v, requests before %v after %v", charges, before, after)
	}
	checkJournalOrder(t, readStream(t, store, gateway.Stream(sb)))
}
