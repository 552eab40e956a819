package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
)

// TestE2ENodesPartition cuts a node off instead of killing it. Nodes a and
// b run as `amber up` processes, each in a network namespace of its own
// (testNet), on shared stores reached through the test network's hub.
//
// Node a runs two sandboxes, each with a file and a counter in a process's
// memory, checkpointed. A third checkpoint of the first sandbox is then
// started on a and held by a failpoint inside its commit, after it renewed
// its lease on the sandbox's stream and before it writes the commit
// pointer and the log event (the window fencing exists for). There a's
// link is cut. Node b declares a dead once its lease expires, takes both
// sandboxes over and restores them from their checkpoints: they run on b,
// one generation on, file and counter back. The shared stores are read at
// that moment, and again after the link is healed and a has registered
// again: in between, nothing a could write counts — each stream's events,
// its lease (b's, at the takeover epoch), the committed checkpoints and the
// sandbox rows are unchanged; the held checkpoint, which woke after the
// heal, was refused as fenced (its caller gets 409), its row is failed and
// it left no commit pointer. Node a, its heartbeat refused, destroys its
// stale copies — the free one at once, the one the held checkpoint still
// locks when the checkpoint gives up — and runs again at epoch 2, live; the
// sandboxes still run on b, with their file and a running counter.
func TestE2ENodesPartition(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	bin, dir := e2eSetup(t)
	start := time.Now()
	tn := newTestNet(t)
	shared, adminKey := sharedStores(t, dir)
	db := openStoreDB(t, shared)
	flags := tn.reach(shared)

	// The held checkpoint: chunkstore.publish is evaluated once for the
	// template the first checkpoint pushes, then once per checkpoint; the
	// 4th evaluation (the third checkpoint) sleeps holdFor.
	const holdFor = 75 * time.Second
	fpLog := filepath.Join(dir, "failpoints-a.log")
	a, na := tn.startNode(bin, dir, "node-a-"+tn.tag, adminKey, flags, []string{
		"AMBER_TEST_FAILPOINTS=chunkstore.publish=4:slow/1s@" + holdFor.String(), "AMBER_TEST_FAILPOINT_LOG=" + fpLog})
	b, _ := tn.startNode(bin, dir, "node-b-"+tn.tag, adminKey, flags, nil)
	// (Node ids of this run's own: a node's cgroups are named after its
	// id, and another test's node-a must not meet this one's.)
	if out := b.must("node", "ls"); strings.Count(out, " live ") != 2 {
		t.Fatalf("amber node ls: want 2 live nodes:\n%s", out)
	}

	var ids []string
	file := map[string]string{}
	for i := range 2 {
		id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
		file[id] = fmt.Sprintf("before-cut-%d\n", i)
		a.must("exec", id, "--", "sh", "-c", "printf '"+file[id]+"' > /root/f")
		a.must("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
		ids = append(ids, id)
	}
	// The held checkpoint is of ids[0], the first in id order, which is
	// the order the driver lists its sandboxes in: the copy a discard that
	// waited for each sandbox's lock in turn would be stuck on first.
	sort.Strings(ids)
	time.Sleep(300 * time.Millisecond)
	atCkpt := map[string]int{} // read before the checkpoint: at most its value at the cut
	for _, id := range ids {
		atCkpt[id] = readCount(t, a, id)
		a.must("checkpoint", id)
	}
	if b, _ := os.ReadFile(fpLog); len(b) > 0 {
		t.Fatalf("the failpoint fired before the held checkpoint (a checkpoint evaluates chunkstore.publish more often than this test counts):\n%s", b)
	}

	// The held checkpoint, through a's forwarder; its answer comes after
	// the heal.
	type result struct {
		ck  api.Checkpoint
		err error
	}
	held := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		ck, err := a.cl.Checkpoint(ctx, ids[0], api.CreateCheckpointRequest{}, nil)
		held <- result{ck, err}
	}()
	var fired time.Time
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(fpLog); strings.Contains(string(b), "chunkstore.publish") {
			fired = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the third checkpoint never reached its commit\n%s", tail(a.log(), 30))
		}
	}

	// Cut a off. b takes its sandboxes over.
	tn.Cut(na)
	cut := time.Now()
	gens := map[string]int{}
	for _, id := range ids {
		sb := waitMoved(t, b, id, a.id, 0, 90*time.Second)
		if sb.Node != b.id {
			t.Fatalf("sandbox %s went to %s", id, sb.Node)
		}
		gens[id] = sb.Generation
		t.Logf("sandbox %s runs on node-b at generation %d %s after the cut", id, sb.Generation, time.Since(cut).Round(time.Millisecond))
		if out := b.must("exec", id, "--", "cat", "/root/f"); out != file[id] {
			t.Fatalf("file of %s on node-b: %q", id, out)
		}
		if n := readCount(t, b, id); n < atCkpt[id] {
			t.Fatalf("counter of %s went back from %d to %d", id, atCkpt[id], n)
		}
	}
	nodes, err := b.cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == a.id && (n.State != "dead" || n.TakenBy != b.id || n.Alive) {
			t.Fatalf("node-a while cut off: %+v (want dead, taken by node-b)", n)
		}
	}
	if !driverHas(t, a, ids[0]) || !driverHas(t, a, ids[1]) {
		t.Fatal("node-a lost its copies while cut off: the test would not show that it discards them")
	}
	atTakeover := snapshotStores(t, db, ids)
	for _, id := range ids {
		if l := atTakeover[id].lease; l.holder != engine.LeaseHolder(b.id) || l.epoch < 2 {
			t.Fatalf("stream lease of %s after the takeover: %+v (want node-b's, at a new epoch)", id, l)
		}
	}

	// Heal while the held checkpoint still sleeps: its commit wakes on a
	// connected, fenced node.
	if since := time.Since(fired); since > holdFor-30*time.Second {
		t.Fatalf("the takeover took %s after the failpoint fired: too close to its %s hold to test a stale write after the heal", since, holdFor)
	}
	tn.Heal(na)
	healed := time.Now()

	// a learns it was declared dead and discards its stale copies: the
	// second sandbox's at once, though the held checkpoint still holds the
	// first one's lock (a stuck operation on one copy does not keep the
	// others running); then the first's, once its checkpoint was refused.
	deadline := time.Now().Add(time.Minute)
	for driverHas(t, a, ids[1]) {
		if time.Now().After(deadline) {
			t.Fatalf("node-a still runs its stale copy of %s a minute after the heal\n%s", ids[1], tail(a.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case r := <-held:
		t.Fatalf("node-a discarded its free stale copy of %s only once the held checkpoint of %s ended (%v): one stuck operation kept every stale copy running", ids[1], ids[0], r.err)
	default:
	}
	t.Logf("node-a discarded its free stale copy %s after the heal", time.Since(healed).Round(time.Millisecond))
	// Then it registers again at epoch 2.
	deadline = time.Now().Add(holdFor + time.Minute)
	for !strings.Contains(a.log(), "declared dead") || !strings.Contains(a.log(), "epoch=2") {
		if time.Now().After(deadline) {
			t.Fatalf("node-a never learnt it was declared dead, or did not register again:\n%s", tail(a.log(), 40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("node-a registered again %s after the heal", time.Since(healed).Round(time.Millisecond))
	for _, id := range ids {
		if driverHas(t, a, id) {
			t.Fatalf("node-a still has its stale copy of %s after registering again\n%s", id, tail(a.log(), 30))
		}
	}
	var r result
	select {
	case r = <-held:
	case <-time.After(time.Minute):
		t.Fatal("the held checkpoint never answered")
	}
	if !errdefs.IsFenced(r.err) {
		t.Fatalf("the held checkpoint on node-a: %+v, %v (want refused as fenced)", r.ck, r.err)
	}
	nodes, err = b.cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == a.id && (n.State != "live" || n.Epoch != 2 || !n.Alive) {
			t.Fatalf("node-a after the heal: %+v (want live at epoch 2)", n)
		}
	}
	if out := a.must("node", "ls"); strings.Count(out, " live ") != 2 {
		t.Fatalf("amber node ls through node-a after the heal: want 2 live nodes:\n%s", out)
	}

	// Nothing node-a tried counts.
	afterHeal := snapshotStores(t, db, ids)
	for _, id := range ids {
		was, is := atTakeover[id], afterHeal[id]
		if !reflect.DeepEqual(was.events, is.events) {
			t.Fatalf("events of %s changed while node-a was fenced: %d → %d events (last types %v)", id, len(was.events), len(is.events), lastTypes(is.events, 3))
		}
		if was.lease != is.lease || was.row != is.row || !reflect.DeepEqual(was.committed, is.committed) {
			t.Fatalf("%s changed while node-a was fenced:\n at the takeover %+v\n after the heal  %+v", id, was, is)
		}
		if is.row.node != b.id || is.row.generation != gens[id] || is.row.state != "running" {
			t.Fatalf("row of %s after the heal: %+v (want running on node-b at generation %d)", id, is.row, gens[id])
		}
	}
	var heldID, state string
	if err := db.QueryRow(`SELECT id, state FROM checkpoints WHERE sandbox_id = $1 AND state <> 'committed'`, ids[0]).Scan(&heldID, &state); err != nil {
		t.Fatalf("the held checkpoint's row: %v", err)
	}
	if state != "failed" {
		t.Fatalf("the held checkpoint %s's row is %s, want failed", heldID, state)
	}
	// Its commit pointer (which it may write once healed: the commit point
	// is the fenced log append) is not in the blob store; the committed
	// checkpoints' are.
	pointers := commitPointers(t, shared)
	if pointers[heldID] {
		t.Fatalf("the held checkpoint %s has a commit pointer in the blob store after it was refused", heldID)
	}
	for _, id := range ids {
		for _, c := range afterHeal[id].committed {
			if !pointers[c] {
				t.Fatalf("committed checkpoint %s of %s has no commit pointer (the blob store listing is wrong)", c, id)
			}
		}
	}
	t.Logf("the held checkpoint %s on node-a: %v", heldID, r.err)
	for _, line := range strings.Split(a.log(), "\n") {
		if strings.Contains(line, heldID) || strings.Contains(line, "declared dead") || strings.Contains(line, "stale cop") {
			t.Logf("node-a: %s", line)
		}
	}

	// The sandboxes run on b, unchanged, reached through either node.
	for _, id := range ids {
		for _, via := range []*testNode{a, b} {
			if out := via.must("exec", id, "--", "cat", "/root/f"); out != file[id] {
				t.Fatalf("file of %s through %s after the heal: %q", id, via.id, out)
			}
		}
		n := readCount(t, b, id)
		time.Sleep(200 * time.Millisecond)
		if n2 := readCount(t, a, id); n2 <= n {
			t.Fatalf("counter of %s does not run after the heal: %d then %d", id, n, n2)
		}
		sb, err := a.cl.GetSandbox(context.Background(), id)
		if err != nil || sb.Node != b.id || sb.Generation != gens[id] {
			t.Fatalf("sandbox %s after the heal: %+v %v (want on node-b at generation %d)", id, sb, err, gens[id])
		}
	}
	t.Logf("partition test: %s in all", time.Since(start).Round(time.Second))
}

// storeView is what the shared stores hold for one sandbox.
type storeView struct {
	events    []storedEvent
	lease     streamLease
	committed []string // committed checkpoint ids
	row       struct {
		node       string
		generation int
		state      string
	}
}

type streamLease struct {
	holder string
	epoch  int64
}

type storedEvent struct {
	seq      int64
	envelope string
}

// openStoreDB opens the PostgreSQL schema of the shared flags (as the host
// reaches it, not through the test network).
func openStoreDB(t *testing.T, shared []string) *sql.DB {
	t.Helper()
	for i := 0; i+1 < len(shared); i++ {
		if shared[i] == "--store" {
			db, err := sql.Open("pgx", shared[i+1])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}
	}
	t.Fatal("no --store in the shared flags")
	return nil
}

// snapshotStores reads, for each sandbox, its stream's events and lease,
// its committed checkpoints and its row.
func snapshotStores(t *testing.T, db *sql.DB, ids []string) map[string]storeView {
	t.Helper()
	out := map[string]storeView{}
	for _, id := range ids {
		var v storeView
		rows, err := db.Query(`SELECT seq, envelope FROM events WHERE stream = $1 ORDER BY seq`, engine.Stream(id))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var e storedEvent
			var env []byte
			if err := rows.Scan(&e.seq, &env); err != nil {
				t.Fatal(err)
			}
			e.envelope = string(env)
			v.events = append(v.events, e)
		}
		rows.Close()
		if err := db.QueryRow(`SELECT holder, epoch FROM leases WHERE stream = $1`, engine.Stream(id)).Scan(&v.lease.holder, &v.lease.epoch); err != nil {
			t.Fatalf("lease of %s: %v", id, err)
		}
		rows, err = db.Query(`SELECT id FROM checkpoints WHERE sandbox_id = $1 AND state = 'committed' ORDER BY id`, id)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var c string
			rows.Scan(&c)
			v.committed = append(v.committed, c)
		}
		rows.Close()
		if err := db.QueryRow(`SELECT node, generation, state FROM sandboxes WHERE id = $1`, id).Scan(&v.row.node, &v.row.generation, &v.row.state); err != nil {
			t.Fatalf("row of %s: %v", id, err)
		}
		out[id] = v
	}
	return out
}

// commitPointers lists the checkpoints whose commit pointer is in the
// blob store of the shared flags (read from the host).
func commitPointers(t *testing.T, shared []string) map[string]bool {
	t.Helper()
	spec := ""
	for i := 0; i+1 < len(shared); i++ {
		if shared[i] == "--blobs" {
			spec = shared[i+1]
		}
	}
	bs, _, err := openBlobs(context.Background(), t.TempDir(), spec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for info, err := range bs.List(context.Background(), "tenants/") {
		if err != nil {
			t.Fatalf("list the blob store: %v", err)
		}
		parts := strings.Split(info.Key, "/")
		if n := len(parts); n >= 4 && parts[n-3] == "checkpoints" && parts[n-1] == "COMMITTED" {
			out[parts[n-2]] = true
		}
	}
	return out
}

// lastTypes returns the "type" of the last n events (for messages).
func lastTypes(evs []storedEvent, n int) []string {
	var out []string
	for _, e := range evs[max(0, len(evs)-n):] {
		typ := e.envelope
		if i := strings.Index(typ, `"type":"`); i >= 0 {
			typ = typ[i+8:]
			if j := strings.IndexByte(typ, '"'); j >= 0 {
				typ = typ[:j]
			}
		}
		out = append(out, typ)
	}
	return out
}
