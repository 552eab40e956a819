package audit_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/stores/sqlite"
)

func open(t *testing.T) (*audit.Trail, *sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return audit.New(st, nil), st, path
}

// rewrite replaces the stored envelope of acme's audit record at seq with
// edit's result, re-encoded with a valid checksum: what someone with write
// access to the database would do.
func rewrite(t *testing.T, path string, seq uint64, edit func(*audit.Record)) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var env []byte
	q := `SELECT env FROM events WHERE seq = ? AND sid = (SELECT sid FROM streams WHERE stream = 'audit/acme')`
	if err := db.QueryRow(q, seq).Scan(&env); err != nil {
		t.Fatal(err)
	}
	ev, err := eventlog.Decode(env)
	if err != nil {
		t.Fatal(err)
	}
	var r audit.Record
	if err := json.Unmarshal(ev.Payload, &r); err != nil {
		t.Fatal(err)
	}
	edit(&r)
	ev.Payload, _ = json.Marshal(r)
	b, err := eventlog.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE events SET env = ? WHERE seq = ? AND sid = (SELECT sid FROM streams WHERE stream = 'audit/acme')`, b, seq); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyDetectsTampering(t *testing.T) {
	ctx := context.Background()
	tr, st, path := open(t)
	var recs []audit.Record
	for i := 1; i <= 6; i++ {
		r, err := tr.Append(ctx, "acme", audit.Record{Actor: "key:admin", Action: "POST /v1/sandboxes", Resource: fmt.Sprintf("sbx-%d", i), Outcome: "ok", Status: 201})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if _, err := tr.Append(ctx, "globex", audit.Record{Actor: "system", Action: "x", Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	rep, err := tr.Verify(ctx, "acme")
	if err != nil || !rep.OK || rep.Records != 6 || rep.HeadHash != recs[5].Hash {
		t.Fatalf("intact trail: %+v %v", rep, err)
	}
	st.Close()

	cases := []struct {
		name    string
		tamper  func()
		undo    func()
		bad     uint64
		problem string
	}{
		{"edit", func() { rewrite(t, path, 3, func(r *audit.Record) { r.Outcome = "error" }) },
			func() { rewrite(t, path, 3, func(r *audit.Record) { r.Outcome = "ok" }) }, 3, "edited"},
		// A careful forger recomputes the edited record's own hash; the
		// next record's link still points at the original.
		{"edit and rehash", func() {
			rewrite(t, path, 3, func(r *audit.Record) { r.Resource = "sbx-other"; r.Hash = audit.HashOf(*r) })
		}, func() { rewrite(t, path, 3, func(r *audit.Record) { *r = recs[2] }) }, 4, "link"},
		{"reorder", func() {
			rewrite(t, path, 2, func(r *audit.Record) { *r = recs[4] })
			rewrite(t, path, 5, func(r *audit.Record) { *r = recs[1] })
		}, func() {
			rewrite(t, path, 2, func(r *audit.Record) { *r = recs[1] })
			rewrite(t, path, 5, func(r *audit.Record) { *r = recs[4] })
		}, 2, "link"},
	}
	for _, c := range cases {
		c.tamper()
		st2, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := audit.New(st2, nil).Verify(ctx, "acme")
		st2.Close()
		if err != nil || rep.OK || rep.BadSeq != c.bad || !strings.Contains(rep.Problem, c.problem) {
			t.Errorf("%s: %+v %v; want record %d (%q)", c.name, rep, err, c.bad, c.problem)
		} else {
			t.Logf("%s: found at %d: %s", c.name, rep.BadSeq, rep.Problem)
		}
		c.undo()
	}

	// Deletion.
	db, _ := sql.Open("sqlite", "file:"+path)
	if _, err := db.Exec(`DELETE FROM events WHERE seq = 4 AND sid = (SELECT sid FROM streams WHERE stream = 'audit/acme')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st3, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st3.Close()
	rep, err = audit.New(st3, nil).Verify(ctx, "acme")
	if err != nil || rep.OK || rep.BadSeq != 4 {
		t.Errorf("deleted record 4: %+v %v", rep, err)
	} else {
		t.Logf("deletion: found at %d: %s", rep.BadSeq, rep.Problem)
	}
	if rep, _ := audit.New(st3, nil).Verify(ctx, "globex"); !rep.OK {
		t.Errorf("another tenant's trail: %+v", rep)
	}
}

// TestConcurrentAppendersKeepOneChain: two trails (two daemons) on one
// store append at once; the chain never forks.
func TestConcurrentAppendersKeepOneChain(t *testing.T) {
	ctx := context.Background()
	a, st, _ := open(t)
	b := audit.New(st, nil)
	var wg sync.WaitGroup
	for _, tr := range []*audit.Trail{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				if _, err := tr.Append(ctx, "acme", audit.Record{Actor: "system", Action: "tick", Outcome: "ok"}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rep, err := a.Verify(ctx, "acme")
	if err != nil || !rep.OK || rep.Records != 50 {
		t.Fatalf("%+v %v", rep, err)
	}
}

// keyed opens a keyed, anchored trail over the store at path, anchored in
// dir/audit.head.
func keyed(t *testing.T, path, dir string, key []byte) (*audit.Trail, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a, err := audit.OpenFileAnchor(filepath.Join(dir, "audit.head"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := audit.Open(st, audit.Options{Key: key, Anchor: a})
	if err != nil {
		t.Fatal(err)
	}
	return tr, st
}

// cutTail deletes acme's last n audit rows and lowers the stream's head to
// match: a forger with write access to the database covering the cut.
func cutTail(t *testing.T, path string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const sid = `(SELECT sid FROM streams WHERE stream = 'audit/acme')`
	if _, err := db.Exec(`DELETE FROM events WHERE sid = `+sid+` AND seq > (SELECT head_seq FROM streams WHERE stream = 'audit/acme') - ?`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE streams SET head_seq = head_seq - ? WHERE stream = 'audit/acme'`, n); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyDetectsTruncatedTailUnit: a keyed, anchored trail whose last
// records were cut by SQL (rows and head both) fails Verify, naming the
// missing positions; a crash between the append and the anchor (anchor one
// record behind) does not.
func TestVerifyDetectsTruncatedTailUnit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "events.db")
	key := make([]byte, audit.KeySize)
	key[0] = 7
	tr, st := keyed(t, path, dir, key)
	for i := 1; i <= 6; i++ {
		if _, err := tr.Append(ctx, "acme", audit.Record{Actor: "key:admin", Action: "POST /v1/sandboxes", Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := tr.Verify(ctx, "acme"); err != nil || !rep.OK || rep.Records != 6 {
		t.Fatalf("intact: %+v %v", rep, err)
	}
	// The anchor one behind the log (a crash after the append, before the
	// anchor): still holds.
	a, _ := audit.OpenFileAnchor(filepath.Join(dir, "audit.head"))
	h, _ := a.Load("acme")
	b, _ := st.Bounds(ctx, audit.Stream("acme"))
	if h.Seq != 6 || b.Head != 6 {
		t.Fatalf("anchor %+v, head %d", h, b.Head)
	}
	st.Close()
	behind := filepath.Join(t.TempDir(), "audit.head")
	raw, _ := json.Marshal(map[string]audit.Head{"acme": {Seq: 5, Hash: mustHashAt(t, path, 5)}})
	os.WriteFile(behind, raw, 0o600)
	if rep := verifyWith(t, path, behind, key); !rep.OK {
		t.Fatalf("anchor one behind the log: %+v", rep)
	}

	cutTail(t, path, 2)
	rep := verifyWith(t, path, filepath.Join(dir, "audit.head"), key)
	if rep.OK || rep.BadSeq != 5 || !strings.Contains(rep.Problem, "records 5 to 6 are missing") {
		t.Fatalf("cut 2: %+v", rep)
	}
	t.Logf("cut 2: %s", rep.Problem)
	cutTail(t, path, 4)
	rep = verifyWith(t, path, filepath.Join(dir, "audit.head"), key)
	if rep.OK || !strings.Contains(rep.Problem, "missing") {
		t.Fatalf("cut all: %+v", rep)
	}
	t.Logf("cut all: %s", rep.Problem)
}

func verifyWith(t *testing.T, path, anchor string, key []byte) audit.Report {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := audit.OpenFileAnchor(anchor)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := audit.Open(st, audit.Options{Key: key, Anchor: a})
	rep, err := tr.Verify(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func mustHashAt(t *testing.T, path string, seq uint64) string {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.Read(context.Background(), audit.Stream("acme"), seq, 1)
	if err != nil || len(evs) != 1 {
		t.Fatal(err)
	}
	var r audit.Record
	json.Unmarshal(evs[0].Payload, &r)
	return r.Hash
}

// oldRecord is a record as the unkeyed trail wrote it before version 2
// (its fields, in its order): the test writes such records itself, so it
// does not lean on the code it checks.
type oldRecord struct {
	Time      time.Time `json:"time"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Resource  string    `json:"resource,omitempty"`
	Outcome   string    `json:"outcome"`
	Status    int       `json:"status,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	Detail    string    `json:"detail,omitempty"`
	Prev      string    `json:"prev"`
	Hash      string    `json:"hash,omitempty"`
}

// TestAuditOldChainStillVerifies: a trail of unkeyed records (as today's
// main writes them) goes on under a key: the old records verify the old
// way up to the first keyed one, the whole trail holds, an edit of an old
// record is still found, and an unkeyed record slipped in after keyed ones
// is refused as a forgery.
func TestAuditOldChainStillVerifies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "events.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prev := strings.Repeat("0", 64)
	for i := 1; i <= 3; i++ {
		r := oldRecord{Time: time.Date(2026, 11, 1, 10, i, 0, 0, time.UTC), Actor: "key:admin", Action: "POST /v1/sandboxes",
			Resource: fmt.Sprintf("sbx-%d", i), Outcome: "ok", Status: 201, Prev: prev}
		b, _ := json.Marshal(r)
		h := sha256.Sum256(append([]byte(prev), b...))
		r.Hash = hex.EncodeToString(h[:])
		p, _ := json.Marshal(r)
		ev := eventlog.Event{Tenant: "acme", Stream: audit.Stream("acme"), ID: fmt.Sprintf("audit-old-%d", i), Type: audit.EventType, Version: 1, Time: r.Time, Payload: p}
		if _, err := st.Append(ctx, audit.Stream("acme"), 0, uint64(i-1), ev); err != nil {
			t.Fatal(err)
		}
		prev = r.Hash
	}
	st.Close()

	key := make([]byte, audit.KeySize)
	key[1] = 9
	tr, st := keyed(t, path, dir, key)
	if rep, err := tr.Verify(ctx, "acme"); err != nil || !rep.OK || rep.Records != 3 {
		t.Fatalf("old chain under a keyed trail: %+v %v", rep, err)
	}
	for i := 0; i < 3; i++ {
		if _, err := tr.Append(ctx, "acme", audit.Record{Actor: "system", Action: "tick", Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := tr.List(ctx, "acme", 1, 10)
	if len(ents) != 6 || ents[2].V != 0 || ents[3].V != audit.Keyed || ents[3].Prev != prev || ents[3].Hash != audit.MACOf(key, ents[3].Record) {
		t.Fatalf("records: %+v", ents)
	}
	rep, err := tr.Verify(ctx, "acme")
	if err != nil || !rep.OK || rep.Records != 6 {
		t.Fatalf("old then keyed: %+v %v", rep, err)
	}
	st.Close()

	// An old record edited: found the old way.
	rewrite(t, path, 2, func(r *audit.Record) { r.Actor = "key:other" })
	if rep := verifyWith(t, path, filepath.Join(dir, "audit.head"), key); rep.OK || rep.BadSeq != 2 || !strings.Contains(rep.Problem, "edited") {
		t.Fatalf("old record edited: %+v", rep)
	}
	rewrite(t, path, 2, func(r *audit.Record) { r.Actor = "key:admin" })
	// A keyed record replaced by an unkeyed one (a forger without the key
	// recomputing SHA-256): refused.
	rewrite(t, path, 5, func(r *audit.Record) { r.Action = "forged"; r.V = 0; r.Hash = audit.HashOf(*r) })
	if rep := verifyWith(t, path, filepath.Join(dir, "audit.head"), key); rep.OK || rep.BadSeq != 5 || !strings.Contains(rep.Problem, "forged") {
		t.Fatalf("unkeyed after keyed: %+v", rep)
	}
	// A keyed record re-MACed with another key: refused.
	rewrite(t, path, 5, func(r *audit.Record) {
		*r = ents[4].Record
		r.Action = "forged"
		r.Hash = audit.MACOf(make([]byte, audit.KeySize), *r)
	})
	if rep := verifyWith(t, path, filepath.Join(dir, "audit.head"), key); rep.OK || rep.BadSeq != 5 || !strings.Contains(rep.Problem, "MAC") {
		t.Fatalf("re-MACed with another key: %+v", rep)
	}
}
