package audit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/audit"
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
