package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
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

// TestOperatorHostsTrustedByNameOnly: a name the operator mapped to a
// loopback service is reachable by that name; the same address dialled by
// a sandbox directly is refused even when the sandbox's allowlist names it.
func TestOperatorHostsTrustedByNameOnly(t *testing.T) {
	ctx := context.Background()
	l := newLedger(t, false)
	st := openStore(t, storePath(t))
	const sb = "sbx-hosts"
	pol := gateway.Policy{Allow: []string{"shop.test:*", l.addr().String()}} // no AllowNets
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(st), Hosts: map[string]netip.Addr{"shop.test": l.addr().Addr()}})
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "t1", Sandbox: sb, ID: "r", Epoch: acquire(t, st, sb, "n"), Policy: pol}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, l.addr(), sb)
	get := func(host string) int {
		req, _ := http.NewRequest("GET", "http://"+l.addr().String()+"/ping", nil)
		req.Host = host
		resp, err := f.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(fmt.Sprintf("shop.test:%d", l.addr().Port())); code != 200 {
		t.Fatalf("by the operator's name: %d, want 200", code)
	}
	if code := get(l.addr().String()); code != http.StatusForbidden {
		t.Fatalf("the loopback address itself: %d, want 403", code)
	}
	if _, _, total := l.snapshot(); total != 1 {
		t.Fatalf("the service received %d requests, want 1", total)
	}
}

// TestBandwidthLimit: a sandbox's egress bandwidth bounds how fast a large
// answer reaches it; without a limit the same answer is fast (the control).
func TestBandwidthLimit(t *testing.T) {
	const size = 3 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), size))
	}))
	defer up.Close()
	addr := netip.MustParseAddrPort(up.Listener.Addr().String())
	for _, limit := range []int64{0, 1 << 20} {
		st := openStore(t, storePath(t))
		sb := fmt.Sprintf("sbx-bw-%d", limit)
		pol := allowLoopback(addr)
		pol.BytesPerSecond = limit
		gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(st), MaxJournaledBody: 1 << 10})
		if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "t1", Sandbox: sb, ID: "r", Epoch: acquire(t, st, sb, "n"), Policy: pol}); err != nil {
			t.Fatal(err)
		}
		f := newFront(t, gw, addr, sb)
		t0 := time.Now()
		resp, err := f.client().Get("http://" + addr.String() + "/big")
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		if err != nil || n != size {
			t.Fatalf("limit %d: read %d bytes, %v", limit, n, err)
		}
		switch {
		case limit == 0 && took > 1500*time.Millisecond:
			t.Fatalf("unlimited: %v for 3 MiB; the control is too slow to show anything", took)
		case limit > 0 && took < 1800*time.Millisecond:
			t.Fatalf("1 MiB/s: 3 MiB in %v; want at least ~2 s (one second's burst, then the rate)", took)
		}
		t.Logf("limit %d B/s: 3 MiB in %v", limit, took.Round(time.Millisecond))
	}
}
