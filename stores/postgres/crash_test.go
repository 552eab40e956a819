package postgres_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/stores/postgres"
)

// The crash test re-executes this test binary as a child that appends
// batches in a loop and reports each one to the parent on fd 3 only after
// Append returned. The parent SIGKILLs the child at a random moment, then
// checks the database: every acknowledged batch is there at the positions
// Append reported, every visible batch is whole, positions are gap-free.
//
// SIGKILL of the client cannot lose what PostgreSQL acknowledged (the server
// keeps running); what it does test is that a client dying between BEGIN and
// COMMIT, or with COMMIT in flight, leaves no partial batch and no gap.
// Durability against a crash of the server host rests on synchronous_commit
// and fsync, which TestDurabilitySettings asserts.

const (
	crashChildEnv   = "AMBER_PG_CRASH_CHILD" // schema the child writes to
	crashRoundEnv   = "AMBER_PG_CRASH_ROUND"
	crashStreams    = 4
	crashMaxBatch   = 8
	crashRoundsEnv  = "AMBER_PG_CRASH_ROUNDS"
	crashRoundsDflt = 12
)

type crashPayload struct {
	Batch string `json:"batch"`
	N     int    `json:"n"`
	I     int    `json:"i"`
}

// TestCrashChild is the child's body; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	schema := os.Getenv(crashChildEnv)
	if schema == "" {
		return
	}
	round := os.Getenv(crashRoundEnv)
	acks := os.NewFile(3, "acks")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, withAppName(testDSN(), crashAppName(schema)), postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range crashStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := fmt.Sprintf("crash/%d", g)
			for b := 0; ctx.Err() == nil; b++ {
				bounds, err := s.Bounds(ctx, stream)
				if err != nil {
					t.Error(err)
					return
				}
				id := fmt.Sprintf("r%s-g%d-b%d", round, g, b)
				n := 1 + rand.IntN(crashMaxBatch)
				evs := make([]eventlog.Event, n)
				for i := range evs {
					p, _ := json.Marshal(crashPayload{Batch: id, N: n, I: i})
					evs[i] = eventlog.Event{Tenant: "crash", ID: fmt.Sprintf("%s-%d", id, i), Type: "crash.step", Version: 1, Payload: p}
				}
				res, err := s.Append(ctx, stream, 0, bounds.Head, evs...)
				if errdefs.IsConflict(err) {
					continue // a batch of the killed predecessor landed after Bounds
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				fmt.Fprintf(acks, "%s %d %d %s\n", stream, res.First, res.Last, id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

type ack struct {
	stream      string
	first, last uint64
	batch       string
}

func TestCrashKillClient(t *testing.T) {
	t.Parallel()
	rounds := crashRoundsDflt
	if v, err := strconv.Atoi(os.Getenv(crashRoundsEnv)); err == nil && v > 0 {
		rounds = v
	}
	schema := freshSchema(t)
	s := openStore(t, schema, clock.Real{}) // migrates before the first child
	var all []ack
	for round := range rounds {
		acked := runCrashRound(t, schema, round)
		all = append(all, acked...)
		checkCrashLog(t, s, all)
		t.Logf("round %d: %d batches acknowledged before SIGKILL", round, len(acked))
	}
	var total uint64
	for g := range crashStreams {
		b, _ := s.Bounds(context.Background(), fmt.Sprintf("crash/%d", g))
		total += b.Head
	}
	t.Logf("%d rounds, %d acknowledged batches, %d events in the log", rounds, len(all), total)
}

// runCrashRound starts a child, kills it at a random moment after its
// first acknowledgement and returns every acknowledgement it sent.
func runCrashRound(t *testing.T, schema string, round int) []ack {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+schema, fmt.Sprintf("%s=%d", crashRoundEnv, round))
	cmd.ExtraFiles = []*os.File{w}
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()

	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var acked []ack
	parse := func(line string) {
		var a ack
		if _, err := fmt.Sscanf(line, "%s %d %d %s", &a.stream, &a.first, &a.last, &a.batch); err != nil {
			t.Fatalf("round %d: bad ack %q: %v", round, line, err)
		}
		acked = append(acked, a)
	}
	select {
	case line, ok := <-lines:
		if !ok {
			cmd.Wait()
			t.Fatalf("round %d: child exited before its first append:\n%s", round, stderr.String())
		}
		parse(line)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("round %d: no append acknowledged in 60s:\n%s", round, stderr.String())
	}
	time.Sleep(time.Duration(rand.IntN(150_000)) * time.Microsecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if cmd.ProcessState.ExitCode() != -1 {
		t.Fatalf("round %d: child exited by itself (%v):\n%s", round, cmd.ProcessState, stderr.String())
	}
	for line := range lines { // what it wrote before dying is still in the pipe
		parse(line)
	}
	waitBackendsGone(t, crashAppName(schema))
	return acked
}

func crashAppName(schema string) string { return "amber-crash-" + schema }

func withAppName(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// waitBackendsGone waits until the server has ended every session of the
// killed child. Until then a batch the child sent before dying may still
// commit; after, the log can no longer change behind the checker's back.
func waitBackendsGone(t *testing.T, appName string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n); err != nil {
			t.Fatalf("waiting for the killed child's sessions to end: %v", err)
		}
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkCrashLog reads every crash stream whole and checks it against the
// acknowledgements.
func checkCrashLog(t *testing.T, s eventlog.Store, acked []ack) {
	t.Helper()
	ctx := context.Background()
	byStream := map[string]map[uint64]string{} // stream -> seq -> event id
	for g := range crashStreams {
		stream := fmt.Sprintf("crash/%d", g)
		ids := map[uint64]string{}
		byStream[stream] = ids
		var cur crashPayload
		next := uint64(1)
		for {
			evs, err := s.Read(ctx, stream, next, 1000)
			if err != nil {
				t.Fatalf("read %s from %d: %v", stream, next, err)
			}
			if len(evs) == 0 {
				break
			}
			for _, e := range evs {
				if e.Seq != next {
					t.Fatalf("%s: gap: want seq %d, got %d", stream, next, e.Seq)
				}
				next++
				ids[e.Seq] = e.ID
				var p crashPayload
				if err := json.Unmarshal(e.Payload, &p); err != nil {
					t.Fatal(err)
				}
				// Each batch's events are consecutive and complete.
				if p.I == 0 {
					if cur.N != 0 && cur.I != cur.N-1 {
						t.Fatalf("%s/%d: batch %s is partial (%d of %d events) before batch %s", stream, e.Seq, cur.Batch, cur.I+1, cur.N, p.Batch)
					}
				} else if p.Batch != cur.Batch || p.I != cur.I+1 {
					t.Fatalf("%s/%d: event %d of batch %s follows event %d of batch %s", stream, e.Seq, p.I, p.Batch, cur.I, cur.Batch)
				}
				cur = p
			}
		}
		if cur.N != 0 && cur.I != cur.N-1 {
			t.Fatalf("%s: last batch %s is partial (%d of %d events)", stream, cur.Batch, cur.I+1, cur.N)
		}
		if b, err := s.Bounds(ctx, stream); err != nil || b.Head != next-1 {
			t.Fatalf("%s: bounds %+v (%v), read up to %d", stream, b, err, next-1)
		}
	}
	for _, a := range acked {
		for seq := a.first; seq <= a.last; seq++ {
			want := fmt.Sprintf("%s-%d", a.batch, seq-a.first)
			if got := byStream[a.stream][seq]; got != want {
				t.Fatalf("acknowledged %s/%d (batch %s) lost: found %q", a.stream, seq, a.batch, got)
			}
		}
	}
}
