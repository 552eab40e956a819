package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/gateway"
)

// TestResumeRunAfterDaemonRestart: a daemon that restarts while the sandbox
// runs on (no cut) continues the run's numbering from the journal, so a
// request identical to earlier ones is a new effect, not a replay. The
// negative control restarts the numbering and shows the replay that Resume
// prevents.
func TestResumeRunAfterDaemonRestart(t *testing.T) {
	for _, resume := range []bool{true, false} {
		name := map[bool]string{true: "resume", false: "restart-numbering"}[resume]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := newLedger(t, false)
			st := openStore(t, storePath(t))
			const sb = "sbx-resume"
			run := gateway.Run{Tenant: "t1", Sandbox: sb, ID: "ck-1", Epoch: acquire(t, st, sb, "node-a"), Policy: allowLoopback(l.addr())}
			gw1 := gateway.New(gateway.Options{Journal: gateway.NewJournal(st)})
			if err := gw1.StartRun(ctx, run); err != nil {
				t.Fatal(err)
			}
			f := newFront(t, gw1, l.addr(), sb)
			c := f.client()
			for i := 0; i < 2; i++ {
				if code, body, err := charge(c, l.addr().String(), 1); err != nil || code != 200 {
					t.Fatalf("charge %d: %d %q %v", i, code, body, err)
				}
			}
			// The daemon restarts: a new gateway, a new journal reading the
			// same store, a new lease; the sandbox did not move.
			gw2 := gateway.New(gateway.Options{Journal: gateway.NewJournal(st)})
			run.Epoch, run.Resume = acquire(t, st, sb, "node-a"), resume
			if err := gw2.StartRun(ctx, run); err != nil {
				t.Fatal(err)
			}
			f.setGateway(gw2)
			if code, body, err := charge(c, l.addr().String(), 1); err != nil || code != 200 {
				t.Fatalf("charge after restart: %d %q %v", code, body, err)
			}
			charges, _, _ := l.snapshot()
			want := 3
			if !resume {
				want = 2 // the third identical request was answered from the journal
			}
			if charges[1] != want {
				t.Fatalf("charges for step 1 = %d, want %d", charges[1], want)
			}
		})
	}
}

// TestHoldAtCut: a request that arrives during a cut waits and is numbered
// in the run the cut starts, not the one before.
func TestHoldAtCut(t *testing.T) {
	ctx := context.Background()
	l := newLedger(t, false)
	st := openStore(t, storePath(t))
	const sb = "sbx-hold"
	run := gateway.Run{Tenant: "t1", Sandbox: sb, ID: "ck-1", Epoch: acquire(t, st, sb, "node-a"), Policy: allowLoopback(l.addr())}
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(st)})
	if err := gw.StartRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, l.addr(), sb)
	release, drained := gw.Hold(sb, time.Second)
	defer release()
	if !drained {
		t.Fatal("nothing was in flight, yet Hold did not drain")
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := charge(f.client(), l.addr().String(), 7)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if _, _, total := l.snapshot(); total != 0 {
		t.Fatalf("a request went upstream during the cut (%d)", total)
	}
	run.ID = "ck-2"
	if err := gw.StartRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var intents []gateway.IntentPayload
	for _, ev := range readStream(t, st, gateway.Stream(sb)) {
		if ev.Type == gateway.EventIntent {
			var p gateway.IntentPayload
			if err := jsonUnmarshal(ev.Payload, &p); err != nil {
				t.Fatal(err)
			}
			intents = append(intents, p)
		}
	}
	if len(intents) != 1 || intents[0].Run != "ck-2" {
		t.Fatalf("intents %+v, want one in run ck-2", intents)
	}
}
