package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// payScript charges one step at a time, when /root/go<N> appears, and
// writes what the ledger answered to /root/done<N>. It keeps its step in
// memory: after a restore it continues from the cut.
const payScript = `import json, os, sys, time, urllib.request, urllib.error
url = sys.argv[1]
step = 0
while step < 3:
    step += 1
    while not os.path.exists("/root/go%d" % step):
        time.sleep(0.05)
    req = urllib.request.Request(url, data=json.dumps({"step": step, "amount": 100}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            out = "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        out = "%d %s" % (e.code, e.read().decode()[:300])
    except Exception as e:
        out = "ERR %r" % (e,)
    with open("/root/done%d.tmp" % step, "w") as f:
        f.write(out)
    os.rename("/root/done%d.tmp" % step, "/root/done%d" % step)
`

type effectsCase struct {
	point      string // gateway failpoint, fired at the 2nd request (step 2)
	action     string // kill-sandbox or kill-daemon
	idempotent bool   // the ledger honours Idempotency-Key
	atMostOnce bool   // the sandbox's policy says at-most-once for the ledger
	journal    bool
}

// TestE2EEffectsExactlyOnce is the crash matrix of the egress gateway: a
// program in a python sandbox charges a real ledger server once per step,
// through the gateway, by name. At step 2 the test crashes — the sandbox or
// the daemon, SIGKILL — exactly at one of the gateway's three crash points
// (a failpoint the daemon arms from AMBER_TEST_FAILPOINTS and logs as
// reached), recovers the sandbox from the checkpoint taken after step 1,
// and lets the re-run continue. The ledger must hold exactly one charge
// per step (or, at-most-once on a ledger without idempotency, at most one
// and a reconciliation flag); once an outcome was recorded the re-run must
// not reach the ledger at all. The negative control runs without the
// journal and must show the duplicate.
func TestE2EEffectsExactlyOnce(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	var cases []effectsCase
	for _, p := range []string{gateway.FPBeforeSend, gateway.FPAfterSend, gateway.FPAfterOutcome} {
		for _, a := range []string{"kill-sandbox", "kill-daemon"} {
			cases = append(cases, effectsCase{point: p, action: a, idempotent: true, journal: true})
		}
		cases = append(cases, effectsCase{point: p, action: "kill-daemon", atMostOnce: true, journal: true})
	}
	cases = append(cases, effectsCase{point: gateway.FPAfterSend, action: "kill-sandbox", journal: false})
	for _, c := range cases {
		name := fmt.Sprintf("%s/%s/idem=%v/amo=%v/journal=%v", strings.TrimPrefix(c.point, "gateway."), c.action, c.idempotent, c.atMostOnce, c.journal)
		t.Run(name, func(t *testing.T) { runEffectsCase(t, c) })
	}
}

func runEffectsCase(t *testing.T, c effectsCase) {
	bin, dir := e2eSetup(t)
	ledger := egresstest.NewLedger(t, c.idempotent)
	port := ledger.Addr().Port()
	dest := fmt.Sprintf("payments.test:%d", port)
	fplog := filepath.Join(dir, "failpoints.log")
	env := []string{"AMBER_TEST_FAILPOINTS=" + c.point + "=2:" + c.action, "AMBER_TEST_FAILPOINT_LOG=" + fplog}
	flags := []string{"--pool", "0", "--egress-host", "payments.test=127.0.0.1", "--egress-journal=" + fmt.Sprint(c.journal)}
	addr := freeAddr(t)
	d := startDaemonEnv(t, bin, dir, addr, env, flags...)

	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "python", "--egress-allow", dest))
	if c.atMostOnce {
		d.must("sandbox", "egress", id, "--allow", dest, "--mode", dest+"=at-most-once")
	}
	if out, errs, code := d.amberIn(payScript, "files", "put", id, "-", "/root/pay.py"); code != 0 {
		t.Fatalf("files put: %d %s %s", code, out, errs)
	}
	if _, err := os.Stat(fplog); err == nil {
		t.Fatal("a failpoint fired before the program ran")
	}
	d.must("exec", "-d", id, "--", "python3", "/root/pay.py", fmt.Sprintf("http://%s/charge", dest))
	waitFile := func(d *daemon, name string) string {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, _, code := d.amber("exec", id, "--", "cat", "/root/"+name)
			if code == 0 {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("/root/%s never appeared\ndaemon log:\n%s", name, tail(d.log(), 40))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	d.must("exec", id, "--", "touch", "/root/go1")
	if got := waitFile(d, "done1"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("step 1 answered %q", got)
	}
	// The cut: the program has charged step 1 and waits for go2.
	d.must("checkpoint", id)

	// Step 2 reaches the failpoint. With kill-daemon the daemon may die
	// before this very call has answered: its outcome proves nothing, the
	// failpoint log does.
	if _, errs, code := d.amber("exec", id, "--", "touch", "/root/go2"); code != 0 && c.action != "kill-daemon" {
		t.Fatalf("touch go2: exit %d: %s", code, errs)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(fplog)
		if strings.Contains(string(b), c.point+" "+id+" "+c.action) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failpoint %s was not reached for %s (log %q)\ndaemon log:\n%s", c.point, id, b, tail(d.log(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c.action == "kill-daemon" {
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			t.Fatal("the daemon did not die at the failpoint")
		}
		if ws, ok := d.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("daemon ended with %v, want SIGKILL", d.cmd.ProcessState)
		}
		d = startDaemon(t, bin, dir, addr, flags...) // failpoints not armed again
	}
	// Whatever survived, the sandbox comes back from the cut after step 1.
	d.must("sandbox", "recover", id)
	d.must("exec", id, "--", "touch", "/root/go2")
	done2 := waitFile(d, "done2")
	d.must("exec", id, "--", "touch", "/root/go3")
	if got := waitFile(d, "done3"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("step 3 answered %q", got)
	}

	charges := ledger.Charges()
	var fx struct {
		Effects []struct {
			URL, State string
			Attempts   int
		} `json:"effects"`
		NeedsReconciliation int `json:"needs_reconciliation"`
	}
	if err := json.Unmarshal([]byte(d.must("--json", "sandbox", "effects", id)), &fx); err != nil {
		t.Fatal(err)
	}
	t.Logf("ledger charges %v, step-2 requests %d; done2 %q; reconciliations %d", charges, ledger.StepRequests(2), done2, fx.NeedsReconciliation)
	if charges[1] != 1 || charges[3] != 1 {
		t.Fatalf("steps 1 and 3 charged %d and %d times, want once each", charges[1], charges[3])
	}
	switch {
	case !c.journal:
		// The negative control: without the journal the re-run charges again.
		if charges[2] != 2 {
			t.Fatalf("without the journal step 2 was charged %d times; the matrix cannot see duplicates", charges[2])
		}
		return
	case c.atMostOnce && c.point != gateway.FPAfterOutcome && c.action == "kill-daemon":
		// The intent was recorded, the outcome lost: never re-sent.
		if charges[2] > 1 || fx.NeedsReconciliation != 1 || !strings.Contains(done2, "reconcil") {
			t.Fatalf("at-most-once: step 2 charged %d times, %d reconciliations, program saw %q; want ≤1, 1, a reconciliation error", charges[2], fx.NeedsReconciliation, done2)
		}
		reconcileE2E(t, d, id, charges[2] == 1)
		return
	}
	if charges[2] != 1 {
		t.Fatalf("step 2 charged %d times, want exactly once", charges[2])
	}
	if !strings.HasPrefix(done2, "200 ") {
		t.Fatalf("step 2 answered %q after recovery", done2)
	}
	if fx.NeedsReconciliation != 0 {
		t.Fatalf("%d effects need reconciliation", fx.NeedsReconciliation)
	}
	// An outcome recorded before the crash (the gateway lived on after a
	// sandbox kill, or died after recording): the re-run never reached the
	// ledger.
	if c.action == "kill-sandbox" || c.point == gateway.FPAfterOutcome {
		if n := ledger.StepRequests(2); n != 1 {
			t.Fatalf("the ledger received %d requests for step 2; the re-run should have been answered from the journal", n)
		}
		// The effect journal says so: step 2 was answered from it (the
		// audit trail, written asynchronously, is where the count comes from).
		deadline := time.Now().Add(30 * time.Second)
		for {
			if fxs := effectsOf(t, d, id); len(fxs) >= 2 && fxs[1].Replays >= 1 && fxs[0].Replays == 0 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("effects after a re-run answered from the journal: %+v, want step 2 replayed", fxs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func effectsOf(t *testing.T, d *daemon, id string) []api.Effect {
	t.Helper()
	var fx api.EffectList
	if err := json.Unmarshal([]byte(d.must("--json", "sandbox", "effects", id)), &fx); err != nil {
		t.Fatal(err)
	}
	return fx.Effects
}

// reconcileE2E resolves the effect that needs reconciliation through
// the API (as the console's reconcile action does) with what the ledger
// shows, and checks the journal: the effect is done, reconciled, with the
// operator's status; nothing needs reconciliation any more.
func reconcileE2E(t *testing.T, d *daemon, id string, charged bool) {
	t.Helper()
	var key string
	for _, f := range effectsOf(t, d, id) {
		if f.State == "needs-reconciliation" {
			key = f.Key
		}
	}
	status, note := 409, "the ledger has no charge for step 2"
	if charged {
		status, note = 200, "the ledger holds the charge of step 2"
	}
	admin, err := os.ReadFile(filepath.Join(d.dataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(d.addr, strings.TrimSpace(string(admin)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := cl.ReconcileEffect(context.Background(), id, api.ReconcileRequest{Key: key, Status: status, Body: `{"checked":true}`, Note: note})
	if err != nil {
		t.Fatalf("reconcile %s: %v", key, err)
	}
	if got.Key != key || got.State != "done" || got.Status != status || got.Reconciled != note {
		t.Fatalf("reconciled effect: %+v", got)
	}
	var fx api.EffectList
	if err := json.Unmarshal([]byte(d.must("--json", "sandbox", "effects", id)), &fx); err != nil {
		t.Fatal(err)
	}
	if fx.NeedsReconciliation != 0 {
		t.Fatalf("after reconciling: %+v", fx)
	}
	if _, err := cl.ReconcileEffect(context.Background(), id, api.ReconcileRequest{Key: key, Status: 200, Note: "again"}); err == nil || !strings.Contains(err.Error(), "outcome already") {
		t.Fatalf("reconciling twice: %v", err)
	}
}
