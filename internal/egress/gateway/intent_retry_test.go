package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/host/faults"
	"github.com/amber-run/amber/lib/failpoint"
)

// A log that fails for a moment when a request's intent is to be recorded
// delays the request, it does not fail it: nothing was sent yet, so the
// gateway retries the intent and then forwards, once. (Found by amber
// chaos, seed 1009: the agent saw a 503 for an order a retry would have
// placed.)
func TestIntentRetriedWhileTheLogFails(t *testing.T) {
	ctx := context.Background()
	led := newLedger(t, true)
	target := led.addr().String()
	store := openStore(t, storePath(t))
	defer store.Close()
	fps := failpoint.New()
	gw := gateway.New(gateway.Options{Logger: quietLog, Journal: gateway.NewJournal(faults.Log(store, fps))})
	defer gw.Close()
	const sb = "sb-retry"
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: sb, ID: "ckpt-0", Epoch: acquire(t, store, sb, "node-a"), Policy: allowLoopback(led.addr())}); err != nil {
		t.Fatal(err)
	}
	failing := 0
	fps.ArmEach(faults.EventlogAppend, fps.Hits(faults.EventlogAppend)+1, failpoint.Window(400*time.Millisecond, func(string) error {
		failing++
		return errdefs.Unavailablef("injected")
	}))
	f := newFront(t, gw, led.addr(), sb)
	code, body, err := charge(f.client(), target, 1)
	if err != nil || code != 200 {
		t.Fatalf("charge while the log failed for 400ms: %d %q %v", code, body, err)
	}
	if failing < 1 {
		t.Fatal("the log never failed: the test proves nothing")
	}
	if charges, _, _ := led.snapshot(); charges[1] != 1 {
		t.Fatalf("charges %v, want step 1 charged once", charges)
	}
}
