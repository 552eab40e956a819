package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/stores/postgres"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)

func ev(id string, payload string) eventlog.Event {
	return eventlog.Event{Tenant: "acme", ID: id, Type: "test.note", Version: 1, Payload: json.RawMessage(payload)}
}

func mustAppend(t *testing.T, s eventlog.Store, stream string, epoch, expected uint64, evs ...eventlog.Event) eventlog.AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), stream, epoch, expected, evs...)
	if err != nil {
		t.Fatalf("append %s: %v", stream, err)
	}
	return res
}

func wantKind(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("got error %v, want kind %q", err, kind)
	}
}

func TestFencing(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	s := newStore(t, clk)

	mustAppend(t, s, "session/f", 0, eventlog.Any, ev("f0", `{}`)) // before any lease: epoch 0 is current
	l1, err := s.Acquire(ctx, "session/f", "a", 10*time.Second)
	if err != nil || l1.Epoch != 1 || !l1.Expires.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("acquire: %+v %v", l1, err)
	}
	_, err = s.Acquire(ctx, "session/f", "b", 10*time.Second)
	wantKind(t, err, errdefs.ErrConflict)
	_, err = s.Append(ctx, "session/f", 0, eventlog.Any, ev("f1", `{}`))
	wantKind(t, err, errdefs.ErrFenced)
	mustAppend(t, s, "session/f", 1, eventlog.Any, ev("f1", `{}`))

	clk.Advance(11 * time.Second)
	// Expired but not taken over: the holder may still write.
	mustAppend(t, s, "session/f", 1, eventlog.Any, ev("f2", `{}`))
	l2, err := s.Acquire(ctx, "session/f", "b", 10*time.Second)
	if err != nil || l2.Epoch != 2 {
		t.Fatalf("takeover: %+v %v", l2, err)
	}
	_, err = s.Append(ctx, "session/f", 1, eventlog.Any, ev("f3", `{}`))
	wantKind(t, err, errdefs.ErrFenced)
	// Fenced and stale expectedSeq together: fencing wins.
	_, err = s.Append(ctx, "session/f", 1, 0, ev("f3", `{}`))
	wantKind(t, err, errdefs.ErrFenced)
	// A retry of an append that happened answers Duplicate even when fenced.
	if res, err := s.Append(ctx, "session/f", 1, eventlog.Any, ev("f2", `{}`)); err != nil || !res.Duplicate || res.First != 3 {
		t.Fatalf("fenced retry: %+v %v", res, err)
	}
	_, err = s.Renew(ctx, l1, time.Minute)
	wantKind(t, err, errdefs.ErrFenced)
	wantKind(t, s.Release(ctx, l1), errdefs.ErrFenced)

	l2r, err := s.Renew(ctx, l2, time.Minute)
	if err != nil || l2r.Epoch != 2 || !l2r.Expires.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("renew: %+v %v", l2r, err)
	}
	if err := s.Release(ctx, l2r); err != nil {
		t.Fatal(err)
	}
	cur, err := s.CurrentLease(ctx, "session/f")
	if err != nil || cur.Epoch != 2 || cur.Expires.After(clk.Now()) {
		t.Fatalf("after release: %+v %v", cur, err)
	}
	l3, err := s.Acquire(ctx, "session/f", "a", time.Second)
	if err != nil || l3.Epoch != 3 {
		t.Fatalf("acquire after release: %+v %v", l3, err)
	}
	// Re-acquiring one's own lease fences one's earlier incarnation.
	l4, err := s.Acquire(ctx, "session/f", "a", time.Second)
	if err != nil || l4.Epoch != 4 {
		t.Fatalf("re-acquire: %+v %v", l4, err)
	}
	_, err = s.Append(ctx, "session/f", 3, eventlog.Any, ev("f3", `{}`))
	wantKind(t, err, errdefs.ErrFenced)
	if cur, _ := s.CurrentLease(ctx, "session/none"); cur.Epoch != 0 || cur.Holder != "" || !cur.Expires.IsZero() {
		t.Fatalf("lease of unknown stream: %+v", cur)
	}
}

// TestLeaseRace: many holders acquiring one stream at once get distinct
// epochs, and exactly one wins while the lease is live.
func TestLeaseRace(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	s := newStore(t, clk)
	var wg sync.WaitGroup
	var wins atomic.Int32
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Acquire(ctx, "session/race", fmt.Sprintf("h%d", i), time.Minute)
			switch {
			case err == nil:
				wins.Add(1)
			case !errdefs.IsConflict(err):
				t.Errorf("acquire: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d winners", wins.Load())
	}
}

// TestRacingSameIDs: concurrent appends of one event id resolve to one
// append; everyone else gets Duplicate (same stream) or Conflict (another
// stream), never an error of the wrong kind.
func TestRacingSameIDs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clock.NewFake(t0))
	var wg sync.WaitGroup
	var fresh, dup, conflict atomic.Int32
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := "session/same"
			if i%2 == 1 {
				stream = fmt.Sprintf("session/other%d", i)
			}
			res, err := s.Append(ctx, stream, 0, eventlog.Any, ev("dup-a", `{}`), ev("dup-b", `{}`))
			switch {
			case err == nil && res.Duplicate:
				dup.Add(1)
			case err == nil:
				fresh.Add(1)
			case errdefs.IsConflict(err):
				conflict.Add(1)
			default:
				t.Errorf("%s: %v", stream, err)
			}
		}()
	}
	wg.Wait()
	if fresh.Load() != 1 || fresh.Load()+dup.Load()+conflict.Load() != 32 {
		t.Fatalf("fresh %d dup %d conflict %d", fresh.Load(), dup.Load(), conflict.Load())
	}
}

// TestTruncateKeepsIDs: ids of dropped events stay taken, so a late retry
// of a dropped append answers Duplicate with its original positions.
func TestTruncateKeepsIDs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clock.NewFake(t0))
	for i := 1; i <= 10; i++ {
		e := ev(fmt.Sprintf("t%d", i), `{}`)
		if i == 6 {
			e.CheckpointRef = "ckpt-1"
		}
		mustAppend(t, s, "session/t", 0, eventlog.Any, e)
	}
	if err := s.Truncate(ctx, "session/t", 6); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Append(ctx, "session/t", 0, eventlog.Any, ev("t2", `{}`)); err != nil || !res.Duplicate || res.First != 2 {
		t.Fatalf("retry of a dropped event: %+v %v", res, err)
	}
	_, err := s.Append(ctx, "session/t", 0, eventlog.Any, ev("t2", `{"other":1}`))
	wantKind(t, err, errdefs.ErrConflict)
}

func TestCorruptEnvelopeIsDataLoss(t *testing.T) {
	ctx := context.Background()
	for name, sql := range map[string]string{
		"flipped byte": `UPDATE events SET envelope = set_byte(envelope, 10, get_byte(envelope, 10) # 1) WHERE stream = $1 AND seq = 2`,
		"truncated":    `UPDATE events SET envelope = substring(envelope from 1 for 20) WHERE stream = $1 AND seq = 2`,
		"moved":        `UPDATE events SET envelope = (SELECT envelope FROM events WHERE stream = $1 AND seq = 1) WHERE stream = $1 AND seq = 2`,
		"deleted":      `DELETE FROM events WHERE stream = $1 AND seq = 2`,
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, clock.NewFake(t0))
			for i := 1; i <= 3; i++ {
				mustAppend(t, s, "session/c", 0, eventlog.Any, ev(fmt.Sprintf("c%d", i), `{"text":"hello"}`))
			}
			if _, err := s.Pool().Exec(ctx, sql, "session/c"); err != nil {
				t.Fatal(err)
			}
			_, err := s.Read(ctx, "session/c", 1, 10)
			wantKind(t, err, errdefs.ErrDataLoss)
			if !strings.Contains(err.Error(), "session/c/2") {
				t.Fatalf("error does not name the position: %v", err)
			}
			if got, err := s.Read(ctx, "session/c", 3, 10); err != nil || len(got) != 1 {
				t.Fatalf("read after the damage: %v %v", got, err)
			}
		})
	}
}

// TestNotifyAcrossStores: a Subscribe on one Store wakes promptly at an
// append through another Store (another pool, as another process would be),
// by LISTEN/NOTIFY rather than polling.
func TestNotifyAcrossStores(t *testing.T) {
	old := eventlog.PollInterval
	eventlog.PollInterval = time.Hour
	t.Cleanup(func() { eventlog.PollInterval = old })

	schema := freshSchema(t)
	a := openStore(t, schema, clock.Real{})
	b := openStore(t, schema, clock.Real{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name   string
		writer *postgres.Store
	}{{"other store", a}, {"same store", b}} {
		sub := eventlog.Subscribe(b, "session/n-"+tc.name, 1)
		got := make(chan time.Time, 1)
		go func() {
			if _, err := sub.Next(ctx); err != nil {
				t.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(100 * time.Millisecond) // let the subscriber block
		start := time.Now()
		mustAppend(t, tc.writer, "session/n-"+tc.name, 0, 0, ev("n-"+tc.name, `{}`))
		acked := time.Now()
		select {
		case woke := <-got:
			t.Logf("%s: append took %v, subscriber woke %v after the ack", tc.name, acked.Sub(start), woke.Sub(acked))
		case <-ctx.Done():
			t.Fatalf("%s: subscriber not woken", tc.name)
		}
	}
}

func TestDurabilitySettings(t *testing.T) {
	s := newStore(t, clock.Real{})
	d, err := s.Durability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server durability settings: %v", d)
	if d["synchronous_commit"] != "on" || d["fsync"] != "on" {
		t.Fatalf("PostgreSQL does not flush commits before acknowledging them: synchronous_commit=%s fsync=%s "+
			"(an acknowledged append would not survive a crash of the database host)", d["synchronous_commit"], d["fsync"])
	}
}

// TestMigrations: concurrent Opens of one schema agree, and re-opening
// applies nothing.
func TestMigrations(t *testing.T) {
	schema := freshSchema(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(context.Background(), testDSN(), postgres.Options{Schema: schema})
			if err != nil {
				t.Error(err)
				return
			}
			s.Close()
		}()
	}
	wg.Wait()
	s := openStore(t, schema, clock.Real{})
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM schema_version`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("schema_version rows: %d %v", n, err)
	}
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO schema_version (version, applied_ns) VALUES (99, 0)`); err != nil {
		t.Fatal(err)
	}
	if s2, err := postgres.Open(context.Background(), testDSN(), postgres.Options{Schema: schema}); err == nil || !strings.Contains(err.Error(), "newer") {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("Open of a schema from a newer binary: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := postgres.Open(ctx, testDSN(), postgres.Options{Schema: "Bad-Name"})
	wantKind(t, err, errdefs.ErrInvalidArgument)
	_, err = postgres.Open(ctx, "postgres://amber@127.0.0.1:1/x?connect_timeout=5", postgres.Options{})
	wantKind(t, err, errdefs.ErrUnavailable)
	_, err = postgres.Open(ctx, "postgres://%zz", postgres.Options{})
	wantKind(t, err, errdefs.ErrInvalidArgument)
}

// TestListenerReconnects: when the server drops the LISTEN connection, the
// Store reconnects and cross-process wake-ups resume.
func TestListenerReconnects(t *testing.T) {
	old := eventlog.PollInterval
	eventlog.PollInterval = time.Hour
	t.Cleanup(func() { eventlog.PollInterval = old })

	schema := freshSchema(t)
	a := openStore(t, schema, clock.Real{})
	b := openStore(t, schema, clock.Real{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var killed int
	err := a.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`, schema).Scan(&killed)
	if err != nil || killed != 2 {
		t.Fatalf("terminated %d listeners: %v", killed, err)
	}
	for i := range 5 {
		stream := fmt.Sprintf("session/re%d", i)
		sub := eventlog.Subscribe(b, stream, 1)
		got := make(chan error, 1)
		go func() {
			_, err := sub.Next(ctx)
			got <- err
		}()
		time.Sleep(200 * time.Millisecond)
		mustAppend(t, a, stream, 0, 0, ev(fmt.Sprintf("re%d", i), `{}`))
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("append %d after the listener was dropped did not wake the other store", i)
		}
	}
}
