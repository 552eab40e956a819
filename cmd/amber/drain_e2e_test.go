package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// TestE2ENodesDrain drains a node of a two-node deployment on shared stores
// with the CLI and checks that nothing its sandboxes held is lost.
//
// Node a runs three sandboxes, each with a file and a counter living in a
// process's memory. `amber node drain drain-a --wait` (through a's API)
// prints a move per sandbox and returns once a holds none. Then: each
// sandbox runs on b one generation on, with its file, and its counter goes
// on from where it was (the process came back from the checkpoint cut at
// the move; a restart would have no counter at all); a move is not a crash
// (no sandbox.crashed); calls through a's API reach the sandboxes on b,
// and one sent straight to a (marked forwarded) is refused as fenced; a
// client following a sandbox's events through b saw the move; a's driver
// no longer has them; a create through a's API lands on b (placement); and
// `amber node ls` shows a draining, alive, with 0 sandboxes; stopped and
// started again, a registers draining (it stays drained). Draining b
// then is refused (a is draining: no node has room) and leaves b live; a
// drain of an unknown node names it; undrain makes a live again; the
// drains are in the audit trail.
//
// The node ids are drain-a and drain-b, not node-a…: a node's cgroup parent
// is named after its id, and other multi-node tests may run at the same
// time on the machine.
func TestE2ENodesDrain(t *testing.T) {
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	a := startNode(t, bin, dir, "drain-a", adminKey, shared)
	b := startNode(t, bin, dir, "drain-b", adminKey, shared)
	ctx := context.Background()

	const n = 3
	var ids []string
	gen := map[string]int{}
	for i := range n {
		id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
		a.must("exec", id, "--", "sh", "-c", fmt.Sprintf("echo drained-%d > /root/f", i))
		a.must("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
		sb, err := a.cl.GetSandbox(ctx, id)
		if err != nil || sb.Node != "drain-a" || sb.State != "running" {
			t.Fatalf("sandbox %s created through drain-a: %+v %v (want running on drain-a)", id, sb, err)
		}
		ids, gen[id] = append(ids, id), sb.Generation
	}
	time.Sleep(500 * time.Millisecond)
	before := map[string]int{}
	for _, id := range ids {
		before[id] = readCount(t, a, id)
		if before[id] < 3 {
			t.Fatalf("counter of %s is %d: it does not run", id, before[id])
		}
	}
	followed := followEvents(t, b, ids[0], adminKey)

	start := time.Now()
	out := a.must("node", "drain", "drain-a", "--wait")
	took := time.Since(start)
	t.Logf("amber node drain drain-a --wait (%s):\n%s", took.Round(time.Millisecond), out)
	for _, id := range ids {
		if !strings.Contains(out, id+" checkpointed → restored on node drain-b (") {
			t.Fatalf("drain output names no move of %s to drain-b:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "node drain-a is draining and holds no sandboxes") {
		t.Fatalf("drain --wait returned without saying drain-a is empty:\n%s", out)
	}

	for i, id := range ids {
		// Through a's API: forwarded to b.
		sb, err := a.cl.GetSandbox(ctx, id)
		if err != nil || sb.Node != "drain-b" || sb.State != "running" || sb.Generation != gen[id]+1 {
			t.Fatalf("sandbox %s after the drain: %+v %v (want running on drain-b, generation %d)", id, sb, err, gen[id]+1)
		}
		if got := a.must("exec", id, "--", "cat", "/root/f"); got != fmt.Sprintf("drained-%d\n", i) {
			t.Fatalf("file of %s after the drain, through drain-a: %q", id, got)
		}
		c1 := readCount(t, a, id)
		if c1 < before[id] {
			t.Fatalf("counter of %s went back from %d to %d: the process did not come back from the checkpoint", id, before[id], c1)
		}
		time.Sleep(300 * time.Millisecond)
		if c2 := readCount(t, a, id); c2 <= c1 {
			t.Fatalf("counter of %s does not run on drain-b: %d then %d", id, c1, c2)
		}
		_, types := eventIDs(t, a, id)
		if count(types, "sandbox.restored") != 1 || count(types, "sandbox.crashed") != 0 {
			t.Fatalf("events of %s: want one restore and no crash for a move: %v", id, types)
		}
		if !driverHas(t, b, id) {
			t.Fatalf("drain-b's driver does not have %s", id)
		}
	}
	// Straight to a (not forwarded): refused as fenced, the sandbox is b's.
	req, _ := http.NewRequest("POST", "http://"+a.addr+"/v1/sandboxes/"+ids[0]+"/checkpoints", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Amber-Forwarded-By", "test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("checkpoint of a moved sandbox sent straight to drain-a: status %d, want 409 (fenced)", resp.StatusCode)
	}

	// a destroys its stopped copies once their rows are on b (its scan).
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for driverHas(t, a, id) {
			if time.Now().After(deadline) {
				t.Fatalf("drain-a's driver still has %s 60s after the drain\n%s", id, tail(a.log(), 30))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// The follower through b saw the stop and the restore, in order.
	var seen []api.Event
	for timeout := time.After(30 * time.Second); count(eventTypes(seen), "sandbox.restored") == 0; {
		select {
		case ev, ok := <-followed:
			if !ok {
				t.Fatalf("the event stream through drain-b ended after %v", eventTypes(seen))
			}
			seen = append(seen, ev)
		case <-timeout:
			t.Fatalf("the event stream through drain-b did not carry the restore within 30s: %v", eventTypes(seen))
		}
	}
	for i, ev := range seen {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("followed event %d has seq %d: a gap or a repeat: %v", i, ev.Seq, eventTypes(seen))
		}
	}

	// Placement: a create through a (draining) lands on b.
	created := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
	if sb, err := b.cl.GetSandbox(ctx, created); err != nil || sb.Node != "drain-b" {
		t.Fatalf("sandbox created through draining drain-a: %+v %v (want it on drain-b)", sb, err)
	}

	// a: draining, alive, 0 sandboxes (at its next heartbeat).
	deadline = time.Now().Add(30 * time.Second)
	for {
		var na api.Node
		nodes, err := a.cl.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, nd := range nodes {
			if nd.ID == "drain-a" {
				na = nd
			}
		}
		if na.State == "draining" && na.Alive && na.Capacity.Sandboxes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drain-a after the drain: %+v (want draining, alive, 0 sandboxes)", na)
		}
		time.Sleep(250 * time.Millisecond)
	}
	ls := a.must("node", "ls")
	var row string
	for _, l := range strings.Split(ls, "\n") {
		if strings.HasPrefix(l, "drain-a ") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) < 6 || f[3] != "draining" || f[4] != "true" || !strings.HasPrefix(f[5], "0/") {
		t.Fatalf("amber node ls: want drain-a draining, alive, 0 sandboxes:\n%s", ls)
	}

	// A drained node stays drained: stopped and started again, it
	// registers draining (a new epoch), and creates through it still land
	// on b.
	a.stop(syscall.SIGTERM)
	a = startNode(t, bin, dir, "drain-a", adminKey, shared, a.addr)
	if nl, err := b.cl.Nodes(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, nd := range nl {
			if nd.ID == "drain-a" && (nd.State != "draining" || nd.Epoch != 2 || !nd.Alive) {
				t.Fatalf("drain-a started again after its drain: %+v (want draining, alive, epoch 2)", nd)
			}
		}
	}
	if id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal")); id == "" {
		t.Fatal("create through the restarted drained node")
	} else if sb, err := a.cl.GetSandbox(ctx, id); err != nil || sb.Node != "drain-b" {
		t.Fatalf("a create through the restarted drained node: %+v %v (want it on drain-b)", sb, err)
	}

	// Draining b now: nowhere to go (a is draining), refused, b stays live.
	if _, errs, code := a.amber("node", "drain", "drain-b"); code == 0 || !strings.Contains(errs, "drain-a is draining") {
		t.Fatalf("drain drain-b with drain-a draining: exit %d, stderr %q (want refused, naming drain-a draining)", code, errs)
	}
	if _, errs, code := a.amber("node", "drain", "node-z"); code == 0 || !strings.Contains(errs, "node node-z is not registered") {
		t.Fatalf("drain of an unknown node: exit %d, stderr %q", code, errs)
	}
	nodes, err := b.cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if nd.ID == "drain-b" && nd.State != "live" {
			t.Fatalf("drain-b after a refused drain: %+v (want live)", nd)
		}
	}
	if got := a.must("node", "undrain", "drain-a"); !strings.Contains(got, "node drain-a is live") {
		t.Fatalf("amber node undrain drain-a: %q", got)
	}

	// The drains are in the operator's audit trail: the one that moved
	// everything, and the refused one with its reason.
	recs, err := a.cl.Audit(ctx, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	var okDrain, refused bool
	for _, r := range recs {
		if r.Action == "POST /v1/nodes/{id}/drain" && r.Resource == "/v1/nodes/drain-a/drain" && r.Outcome == "ok" {
			okDrain = true
		}
		if r.Action == "POST /v1/nodes/{id}/drain" && r.Resource == "/v1/nodes/drain-b/drain" && r.Outcome != "ok" && strings.Contains(r.Detail, "drain-a is draining") {
			refused = true
		}
	}
	if !okDrain || !refused {
		t.Fatalf("audit trail: drain of drain-a recorded %t, refused drain of drain-b recorded %t: %+v", okDrain, refused, recs)
	}
}

func eventTypes(evs []api.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// TestE2ENodesDrainInterrupted: the target of a move dies midway — after
// it moved the sandbox's row to itself, before it took the stream leases
// (failpoint cluster.move-in.row: SIGKILL) — and the normal failover
// finishes: the draining node, the only live one, takes the dead target
// over, takes the leases from whoever holds them (itself) and restores the
// sandbox from the move's checkpoint (no crash: its counter goes on). When
// the target is back the drain goes on and the sandbox lands there.
//
// It once failed one run in four: the sandbox the failover restored on the
// draining node later died ("its init exited") — the draining node's
// stale-copy sweep had read the row while it was still on the dead target
// and destroyed the copy the failover restored meanwhile. The sweep reads
// the row again under the sandbox's lock now (TestStaleSweepSparesAdoptedCopy).
func TestE2ENodesDrainInterrupted(t *testing.T) {
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	a := startNode(t, bin, dir, "drain-a", adminKey, shared)
	fpLog := filepath.Join(dir, "failpoints.log")
	b := startNodeEnv(t, bin, dir, "drain-b", adminKey, shared,
		[]string{"AMBER_TEST_FAILPOINTS=cluster.move-in.row=1:kill-daemon", "AMBER_TEST_FAILPOINT_LOG=" + fpLog})
	ctx := context.Background()

	id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
	a.must("exec", id, "--", "sh", "-c", "echo interrupted > /root/f")
	a.must("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
	time.Sleep(500 * time.Millisecond)
	before := readCount(t, a, id)
	sb0, err := a.cl.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	a.must("node", "drain", "drain-a")
	select {
	case <-b.exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("drain-b did not reach cluster.move-in.row within 90s\n%s", tail(b.log(), 30))
	}
	if fl, _ := os.ReadFile(fpLog); !strings.Contains(string(fl), "cluster.move-in.row "+id+" kill-daemon") {
		t.Fatalf("drain-b exited, but not at cluster.move-in.row for %s: %q", id, fl)
	}

	// a takes the dead b over: the sandbox runs on a again, from the
	// move's checkpoint, not crashed.
	sb := waitMoved(t, a, id, "drain-b", sb0.Generation, 90*time.Second)
	if sb.Node != "drain-a" || sb.Generation != sb0.Generation+1 {
		t.Fatalf("after drain-b died mid-move: %+v (want running on drain-a, generation %d)", sb, sb0.Generation+1)
	}
	if got := a.must("exec", id, "--", "cat", "/root/f"); got != "interrupted\n" {
		t.Fatalf("file after the interrupted move: %q", got)
	}
	c1 := readCount(t, a, id)
	if c1 < before {
		t.Fatalf("counter went back from %d to %d after the interrupted move", before, c1)
	}
	time.Sleep(300 * time.Millisecond)
	if c2 := readCount(t, a, id); c2 <= c1 {
		t.Fatalf("counter does not run after the interrupted move: %d then %d", c1, c2)
	}
	_, types := eventIDs(t, a, id)
	if count(types, "sandbox.crashed") != 0 || count(types, "sandbox.restored") != 1 {
		t.Fatalf("events after the interrupted move: want one restore, no crash: %v", types)
	}
	nodes, err := a.cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if nd.ID == "drain-b" && (nd.State != "dead" || nd.TakenBy != "drain-a") {
			t.Fatalf("drain-b after it died: %+v (want dead, taken by drain-a)", nd)
		}
	}

	// b back (no failpoint): the drain goes on.
	b2 := startNode(t, bin, dir, "drain-b", adminKey, shared)
	out := a.must("node", "drain", "drain-a", "--wait")
	t.Logf("amber node drain drain-a --wait:\n%s", out)
	if !strings.Contains(out, id+" checkpointed → restored on node drain-b (") {
		t.Fatalf("drain output names no move of %s to drain-b:\n%s", id, out)
	}
	sb, err = b2.cl.GetSandbox(ctx, id)
	if err != nil || sb.Node != "drain-b" || sb.State != "running" || sb.Generation != sb0.Generation+2 {
		t.Fatalf("after the drain went on: %+v %v (want running on drain-b, generation %d)", sb, err, sb0.Generation+2)
	}
	if got := a.must("exec", id, "--", "cat", "/root/f"); got != "interrupted\n" {
		t.Fatalf("file after the second move: %q", got)
	}
	if c3 := readCount(t, a, id); c3 < c1 {
		t.Fatalf("counter went back from %d to %d after the second move", c1, c3)
	}
}

// startNodeEnv is startNode with env added to the daemon's environment.
func startNodeEnv(t *testing.T, bin, dir, id, adminKey string, shared, env []string) *testNode {
	t.Helper()
	ndir := nodeDir(t, dir, id, adminKey)
	addr := freeAddr(t)
	d := startDaemonEnv(t, bin, ndir, addr, env, append(append([]string{}, shared...), "--node-id", id)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of %s (failpoints):\n%s", id, tail(d.log(), 60))
		}
	})
	cl, err := client.New(addr, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{daemon: d, id: id, cl: cl}
}
