package gateway_test

import (
	"context"
	"testing"

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
