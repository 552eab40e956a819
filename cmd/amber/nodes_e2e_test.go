package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// Nodes on shared stores, as separate `amber up` processes on loopback
// (distinct ports and data dirs; TestE2ENodesPartition runs them in network
// namespaces of their own, netns_e2e_test.go): PostgreSQL (`make setup-test`'s, a schema of
// this test's own) for the log, metadata and leases, a MinIO started by the
// test for checkpoints, one master key file and one admin key for all.

// cluster3 is a test deployment of three nodes.
type testNode struct {
	*daemon
	id string
	cl *client.Client
}

func pgTestDSN() string {
	if dsn := os.Getenv("AMBER_TEST_PG"); dsn != "" {
		return dsn
	}
	return "postgres://amber:amber@127.0.0.1:5432/amber_test?sslmode=disable"
}

// sharedStores makes a fresh PostgreSQL schema (dropped at the end), a
// MinIO bucket, a master key file and an admin key, and returns the flags
// every node gets and the admin key.
func sharedStores(t *testing.T, dir string) (flags []string, adminKey string) {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	schema := "nodes_e2e_" + hex.EncodeToString(b[:])
	db, err := sql.Open("pgx", pgTestDSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		db.Close()
		t.Fatalf("this test needs PostgreSQL (make setup-test, or AMBER_TEST_PG): %v", err)
	}
	t.Cleanup(func() {
		db.Exec("DROP SCHEMA " + schema + " CASCADE")
		db.Close()
	})
	sep := "?"
	if strings.Contains(pgTestDSN(), "?") {
		sep = "&"
	}
	dsn := pgTestDSN() + sep + "search_path=" + schema

	blobs := minioBlobs(t, "nodes")

	key := make([]byte, 32)
	rand.Read(key)
	keyFile := filepath.Join(dir, "master.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if adminKey, err = meta.NewKeySecret(); err != nil {
		t.Fatal(err)
	}
	// A node lease longer than the default: the machine running the tests
	// is shared and slow, and a false takeover would fail the test.
	return append([]string{"--pool", "0", "--egress=false", "--node-ttl", "6s", "--store", dsn, "--master-key-file", keyFile}, blobs...), adminKey
}

// nodeDir makes node id's data dir under dir with the shared admin key and
// registers the destruction of its sandboxes and cgroups at the test's end,
// whatever happened to the node.
func nodeDir(t *testing.T, dir, id, adminKey string) string {
	t.Helper()
	ndir := filepath.Join(dir, id)
	if err := os.MkdirAll(ndir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ndir, "admin.key"), []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		destroyLeftovers(t, filepath.Join(ndir, "drivers", enginetest.DriverName()))
		removeCgroups(t, "amber/"+enginetest.DriverName()+"-"+id)
	})
	return ndir
}

// startNode starts node id in dir/id with the shared flags (on addr, when
// given: a restart). Its sandboxes are destroyed when the test ends,
// whatever happened to the node.
func startNode(t *testing.T, bin, dir, id, adminKey string, shared []string, addr ...string) *testNode {
	t.Helper()
	ndir := nodeDir(t, dir, id, adminKey)
	at := freeAddr(t)
	if len(addr) > 0 {
		at = addr[0]
	}
	d := startDaemon(t, bin, ndir, at, append(append([]string{}, shared...), "--node-id", id)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, tail(d.log(), 60))
		}
	})
	cl, err := client.New(at, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{daemon: d, id: id, cl: cl}
}

// driverHas reports whether node n's driver has state for sandbox id.
func driverHas(t *testing.T, n *testNode, id string) bool {
	t.Helper()
	drv := enginetest.NewDriver(t, filepath.Join(n.dataDir, "drivers", enginetest.DriverName()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	infos, err := drv.List(ctx)
	if err != nil {
		t.Fatalf("list %s's sandboxes: %v", n.id, err)
	}
	for _, in := range infos {
		if in.ID == id {
			return true
		}
	}
	return false
}

// waitMoved polls through node via until sandbox id runs on a node other
// than from at a generation above gen, and returns it.
func waitMoved(t *testing.T, via *testNode, id, from string, gen int, within time.Duration) api.Sandbox {
	t.Helper()
	deadline := time.Now().Add(within)
	var last api.Sandbox
	var lastErr error
	for time.Now().Before(deadline) {
		sb, err := via.cl.GetSandbox(context.Background(), id)
		if err == nil && sb.Node != from && sb.State == "running" && sb.Generation > gen {
			return sb
		}
		last, lastErr = sb, err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandbox %s not running elsewhere than %s within %s: last %+v %v\n%s log:\n%s", id, from, within, last, lastErr, via.id, tail(via.log(), 40))
	return api.Sandbox{}
}

// eventTypes returns sandbox id's events read through node via.
func eventIDs(t *testing.T, via *testNode, id string) ([]string, []string) {
	t.Helper()
	evs, err := via.cl.Events(context.Background(), id, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids, types []string
	for _, e := range evs.Events {
		ids = append(ids, e.ID)
		types = append(types, e.Type)
	}
	return ids, types
}

func count(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

// TestE2ENodesFailover runs three nodes on shared stores.
//
// Kill: node a runs two sandboxes, each with a file and a counter living in
// a process's memory, checkpointed. Node a's process is SIGKILLed and its
// sandboxes destroyed. Nodes b and c both see it gone (its liveness lock
// free and a heartbeat missed, before its lease expires) and race to claim
// it: exactly one wins (a's row: dead, taken by the claimer), which
// spreads a's sandboxes over b and c: one each. Each sandbox runs again
// from its checkpoint (the counter goes on from its value at the cut, the
// file is there), on one node only; every event acknowledged before the
// kill is still in its stream, read through the other node (forwarded),
// and a client that followed its event stream through node b from before
// the kill saw every event once, in order, through the restore.
//
// Partition: the node running the first sandbox is then SIGSTOPped (its
// sandboxes run on: a stale copy, as behind a cut link). The last node
// takes over when the stopped node's lease expires (a stopped process
// keeps its lock). A call sent straight to the stopped node once it runs
// again (SIGCONT) is refused as fenced, its heartbeat is refused, and it
// discards its stale copy; the sandbox runs once, on the last node, with
// its state.
func TestE2ENodesFailover(t *testing.T) {
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	a := startNode(t, bin, dir, "node-a", adminKey, shared)
	nodes := map[string]*testNode{"node-a": a}
	for _, id := range []string{"node-b", "node-c"} {
		nodes[id] = startNode(t, bin, dir, id, adminKey, shared)
	}
	if out := a.must("node", "ls"); strings.Count(out, " live ") != 3 {
		t.Fatalf("amber node ls: want 3 live nodes:\n%s", out)
	}

	// Two sandboxes on node a, each with a file and a counter in memory.
	var ids []string
	for i := range 2 {
		id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
		a.must("exec", id, "--", "sh", "-c", fmt.Sprintf("echo before-cut-%d > /root/f", i))
		a.must("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
		ids = append(ids, id)
	}
	time.Sleep(300 * time.Millisecond)
	atCut := map[string]int{}
	for _, id := range ids {
		// Read before the cut: the restored counter is the cut's, which
		// is at least this (read after it, it could be behind).
		atCut[id] = readCount(t, a, id)
		a.must("checkpoint", id)
		sb, err := a.cl.GetSandbox(context.Background(), id)
		if err != nil || sb.Node != "node-a" {
			t.Fatalf("sandbox %s: %+v %v", id, sb, err)
		}
	}
	acked := map[string][]string{}
	for _, id := range ids {
		acked[id], _ = eventIDs(t, nodes["node-b"], id)
		if len(acked[id]) < 3 {
			t.Fatalf("events of %s through node-b: %v", id, acked[id])
		}
	}

	// A client follows the first sandbox's events through node b, from
	// the start, across the failover.
	followed := followEvents(t, nodes["node-b"], ids[0], adminKey)

	// Kill node a: its process, then its sandboxes.
	killed := time.Now()
	a.stop(syscall.SIGKILL)
	destroyLeftovers(t, filepath.Join(a.dataDir, "drivers", enginetest.DriverName()))
	on := map[string]string{} // sandbox → the node it runs on now
	for _, id := range ids {
		sb := waitMoved(t, nodes["node-b"], id, "node-a", 0, 90*time.Second)
		t.Logf("sandbox %s runs on %s again %s after node-a was killed", id, sb.Node, time.Since(killed).Round(time.Millisecond))
		on[id] = sb.Node
	}
	if on[ids[0]] == on[ids[1]] {
		t.Fatalf("node-a's two sandboxes both went to %s: a dead node's sandboxes are spread over the live nodes (b and c both had room)", on[ids[0]])
	}
	survivor := func(not string) string {
		if not == "node-b" {
			return "node-c"
		}
		return "node-b"
	}
	nl, err := nodes["node-b"].cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var claimer string
	for _, n := range nl {
		if n.ID == "node-a" {
			if n.State != "dead" || (n.TakenBy != "node-b" && n.TakenBy != "node-c") || n.Alive {
				t.Fatalf("node-a after the kill: %+v (want dead, taken by b or c)", n)
			}
			claimer = n.TakenBy
		}
	}
	// A killed process ends its database session and frees its liveness
	// lock: node-a was claimed as gone, not at its lease's end.
	if !hasLogLine(nodes[claimer].log(), "node process gone", "dead_node=node-a") {
		t.Fatalf("%s did not claim node-a by its free liveness lock:\n%s", claimer, tail(nodes[claimer].log(), 30))
	}
	for i, id := range ids {
		l := nodes[survivor(on[id])]
		if driverHas(t, l, id) {
			t.Fatalf("%s also runs %s, which runs on %s", l.id, id, on[id])
		}
		// Through the other node: forwarded to the one running it.
		if out := l.must("exec", id, "--", "cat", "/root/f"); out != fmt.Sprintf("before-cut-%d\n", i) {
			t.Fatalf("file of %s after failover: %q", id, out)
		}
		n := readCount(t, l, id)
		if n < atCut[id] {
			t.Fatalf("counter of %s went back from %d to %d", id, atCut[id], n)
		}
		time.Sleep(200 * time.Millisecond)
		if n2 := readCount(t, l, id); n2 <= n {
			t.Fatalf("counter of %s does not run after failover: %d then %d", id, n, n2)
		}
		got, types := eventIDs(t, l, id)
		have := map[string]bool{}
		for _, e := range got {
			have[e] = true
		}
		for _, e := range acked[id] {
			if !have[e] {
				t.Fatalf("acknowledged event %s of %s lost after failover; stream: %v", e, id, got)
			}
		}
		if count(types, "sandbox.restored") != 1 || count(types, "sandbox.crashed") != 1 {
			t.Fatalf("events of %s: want one crashed and one restored (one winner): %v", id, types)
		}
	}

	// The follower saw every event, in order, without a gap, up to the
	// restore on the winner.
	want, _ := eventIDs(t, nodes["node-c"], ids[0])
	var seen []api.Event
	for timeout := time.After(60 * time.Second); len(seen) < len(want); {
		select {
		case ev, ok := <-followed:
			if !ok {
				t.Fatalf("the event stream through node-b ended after %d of %d events", len(seen), len(want))
			}
			seen = append(seen, ev)
		case <-timeout:
			t.Fatalf("the event stream through node-b delivered %d of %d events in 60s", len(seen), len(want))
		}
	}
	for i, ev := range seen {
		if ev.Seq != uint64(i+1) || ev.ID != want[i] {
			t.Fatalf("followed event %d: seq %d id %s, want seq %d id %s", i, ev.Seq, ev.ID, i+1, want[i])
		}
	}
	var seenTypes []string
	for _, ev := range seen {
		seenTypes = append(seenTypes, ev.Type)
	}
	if count(seenTypes, "sandbox.restored") != 1 {
		t.Fatalf("the followed stream did not carry the restore on the winner: %v", seenTypes)
	}

	// Partition the node running the first sandbox: SIGSTOP its process,
	// its sandboxes run on.
	id := ids[0]
	winner, loser := on[id], survivor(on[id])
	w, l := nodes[winner], nodes[loser]
	sb, _ := w.cl.GetSandbox(context.Background(), id)
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.cmd.Process.Signal(syscall.SIGCONT) })
	moved := waitMoved(t, l, id, winner, sb.Generation, 90*time.Second)
	if moved.Node != loser {
		t.Fatalf("after %s stopped, %s runs on %s", winner, id, moved.Node)
	}
	// A stopped process keeps its session and its lock: it was claimed
	// when its lease expired, not before.
	if !hasLogLine(l.log(), "node lease expired", "dead_node="+winner) || hasLogLine(l.log(), "node process gone", "dead_node="+winner) {
		t.Fatalf("%s claimed the stopped %s other than by its lease:\n%s", loser, winner, tail(l.log(), 30))
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Straight to the stale node (not forwarded): refused as fenced.
	req, _ := http.NewRequest("POST", "http://"+w.addr+"/v1/sandboxes/"+id+"/checkpoints", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Amber-Forwarded-By", "test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("checkpoint on the stale node: status %d, want 409 (fenced)", resp.StatusCode)
	}
	deadline := time.Now().Add(60 * time.Second)
	for driverHas(t, w, id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs its stale copy of %s 60s after it came back\n%s", winner, id, tail(w.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// It learns it was declared dead (its heartbeat is refused) and
	// registers again, one epoch on.
	for !strings.Contains(w.log(), "declared dead") || !strings.Contains(w.log(), "epoch=2") {
		if time.Now().After(deadline) {
			t.Fatalf("%s never learnt it was declared dead, or did not register again:\n%s", winner, tail(w.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if driverHas(t, w, ids[1]) {
		t.Fatalf("%s still runs its stale copy of %s after registering again", winner, ids[1])
	}
	nl, err = w.cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nl {
		if n.ID == winner && (n.State != "live" || n.Epoch != 2 || !n.Alive) {
			t.Fatalf("%s after it came back: %+v (want live at epoch 2)", winner, n)
		}
	}
	if out := w.must("exec", id, "--", "cat", "/root/f"); out != "before-cut-0\n" {
		t.Fatalf("file of %s after the second failover, through the healed node: %q", id, out)
	}
	_, types := eventIDs(t, w, id)
	if count(types, "sandbox.restored") != 2 {
		t.Fatalf("events of %s: want two restores: %v", id, types)
	}
}

// hasLogLine reports whether one line of log holds every part.
func hasLogLine(log string, parts ...string) bool {
	for line := range strings.Lines(log) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// removeCgroups removes the (empty, once its sandboxes are destroyed)
// cgroup parent of a node in every v1 hierarchy, deepest first.
func removeCgroups(t *testing.T, parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	for _, d := range dirs {
		subs, _ := filepath.Glob(filepath.Join(d, "*"))
		for _, s := range subs {
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				if err := os.Remove(s); err != nil {
					t.Logf("remove cgroup %s: %v", s, err)
				}
			}
		}
		if err := os.Remove(d); err != nil {
			t.Logf("remove cgroup %s: %v", d, err)
		}
	}
}

// readCount reads the counter a test sandbox's process keeps in
// /tmp/count (written to a new file and renamed: never seen half written).
func readCount(t *testing.T, via *testNode, id string) int {
	t.Helper()
	out := via.must("exec", id, "--", "cat", "/tmp/count")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("counter of %s: %q is not a number", id, out)
	}
	return n
}

// followEvents follows sandbox id's events through node via from the
// first (GET …/events?follow=true, newline-delimited JSON) until the test
// ends.
func followEvents(t *testing.T, via *testNode, id, key string) <-chan api.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+via.addr+"/v1/sandboxes/"+id+"/events?follow=true&from=1", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("follow events of %s: status %d", id, resp.StatusCode)
	}
	ch := make(chan api.Event, 1000)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev api.Event
			if err := dec.Decode(&ev); err != nil {
				return
			}
			ch <- ev
		}
	}()
	return ch
}
