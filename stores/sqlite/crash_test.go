package sqlite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
)

// The crash test re-executes this test binary as a child that appends to a
// database until the parent kills it with SIGKILL. These variables switch
// the child on.
const (
	envCrashDB    = "AMBER_SQLITE_CRASH_DB"
	envCrashSeed  = "AMBER_SQLITE_CRASH_SEED"
	envCrashRound = "AMBER_SQLITE_CRASH_ROUND"
	crashStreams  = 4
)

func TestMain(m *testing.M) {
	if path := os.Getenv(envCrashDB); path != "" {
		crashChild(path)
		return
	}
	os.Exit(m.Run())
}

// crashPayload is what every crash-test event carries: which batch it
// belongs to, its index in it and the batch's size, so that the parent can
// tell a complete batch from a torn one without having heard of it.
type crashPayload struct {
	Batch string `json:"batch"`
	I     int    `json:"i"`
	N     int    `json:"n"`
	Pad   string `json:"pad"`
}

func crashPad(batch string, i int) string {
	return strings.Repeat(fmt.Sprintf("%s/%d;", batch, i), 1+len(batch)%5)
}

// crashChild appends to crashStreams streams from as many goroutines,
// single events and batches of random size, each at the head it expects,
// and writes "ack STREAM FIRST LAST BATCH" to stdout after each Append
// returned — never before. It runs until killed.
func crashChild(path string) {
	seed, _ := strconv.ParseUint(os.Getenv(envCrashSeed), 10, 64)
	round := os.Getenv(envCrashRound)
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	var out sync.Mutex
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range crashStreams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			stream := fmt.Sprintf("session/crash-%d", g)
			b, err := s.Bounds(ctx, stream)
			if err != nil {
				fmt.Fprintln(os.Stderr, "bounds:", err)
				os.Exit(3)
			}
			head := b.Head
			for i := 0; ; i++ {
				n := 1
				if rng.IntN(2) == 0 {
					n = 2 + rng.IntN(24)
				}
				batch := fmt.Sprintf("r%s-g%d-%d", round, g, i)
				evs := make([]eventlog.Event, n)
				for j := range evs {
					p, _ := json.Marshal(crashPayload{batch, j, n, crashPad(batch, j)})
					evs[j] = eventlog.Event{Tenant: "crash", ID: fmt.Sprintf("%s/%d", batch, j), Type: "crash.test", Version: 1, Payload: p}
				}
				res, err := s.Append(ctx, stream, 0, head, evs...)
				if err != nil {
					fmt.Fprintf(os.Stderr, "append %s at %d: %v\n", batch, head, err)
					os.Exit(3)
				}
				line := fmt.Sprintf("ack %s %d %d %s\n", stream, res.First, res.Last, batch)
				out.Lock()
				os.Stdout.WriteString(line) // one write(2): atomic on a pipe
				out.Unlock()
				head = res.Last
			}
		})
	}
	wg.Wait()
}

type crashAck struct {
	stream      string
	first, last uint64
	batch       string
}

// TestCrash kills an appending child with SIGKILL at random moments (during
// Open, between and inside group commits) and checks after each kill that
// every acknowledged append is present with its content, that no batch is
// partly visible and that positions stay gap-free; the next round appends
// to the same database. Replay a failure with AMBER_CRASH_SEED; change the
// number of rounds with AMBER_CRASH_ROUNDS.
func TestCrash(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("AMBER_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	if v := os.Getenv("AMBER_CRASH_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	t.Logf("seed %d (replay with AMBER_CRASH_SEED=%d), %d rounds", seed, seed, rounds)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "crash.db")
	var acked []crashAck
	var events uint64
	for round := range rounds {
		// Mostly mid-append, some time after the first acknowledgement;
		// one round in six from the start, often inside Open.
		early := rng.IntN(6) == 0
		delay := time.Duration(rng.IntN(80)) * time.Millisecond
		if early {
			delay = time.Duration(rng.IntN(40)) * time.Millisecond
		}
		got, stderr := runCrashChild(t, path, seed+uint64(round), round, early, delay)
		acked = append(acked, got...)
		events = verifyCrash(t, path, acked, round, seed)
		if t.Failed() {
			t.Fatalf("round %d (killed %v after %s; child stderr: %q)", round, delay, map[bool]string{true: "start", false: "first ack"}[early], stderr)
		}
	}
	if len(acked) < rounds {
		t.Fatalf("only %d appends acknowledged in %d rounds: the child barely ran", len(acked), rounds)
	}
	t.Logf("%d acknowledged appends, %d events in the log after %d kills", len(acked), events, rounds)
}

// runCrashChild runs one child, kills it delay after it started (early) or
// after its first acknowledgement, and returns the appends it acknowledged.
func runCrashChild(t *testing.T, path string, seed uint64, round int, early bool, delay time.Duration) ([]crashAck, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashDB+"="+path, envCrashSeed+"="+fmt.Sprint(seed), envCrashRound+"="+fmt.Sprint(round))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan []string, 1)
	firstAck := make(chan struct{})
	go func() {
		var ls []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if ls = append(ls, sc.Text()); len(ls) == 1 {
				close(firstAck)
			}
		}
		io.Copy(io.Discard, stdout)
		lines <- ls
	}()
	start := time.Now()
	if !early {
		select {
		case <-firstAck:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-lines
			cmd.Wait()
			t.Fatalf("round %d: no acknowledgement from the child in 10s: %s", round, stderr.String())
		}
	}
	if os.Getenv("AMBER_CRASH_DEBUG") != "" {
		t.Logf("round %d: first ack after %v", round, time.Since(start))
	}
	time.Sleep(delay)
	cmd.Process.Signal(syscall.SIGKILL)
	ls := <-lines // all the child wrote before it died
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("round %d: child ended on its own (%v): %s", round, err, stderr.String())
	}
	var acks []crashAck
	for _, l := range ls {
		var a crashAck
		if _, err := fmt.Sscanf(l, "ack %s %d %d %s", &a.stream, &a.first, &a.last, &a.batch); err != nil {
			t.Fatalf("round %d: child wrote %q: %v", round, l, err)
		}
		acks = append(acks, a)
	}
	return acks, stderr.String()
}

// verifyCrash opens the database the way a restarted server would and
// checks it against every append acknowledged so far. It returns the
// number of events.
func verifyCrash(t *testing.T, path string, acked []crashAck, round int, seed uint64) uint64 {
	t.Helper()
	s, err := Open(path, Options{Clock: clock.Real{}})
	if err != nil {
		if round == 0 && len(acked) == 0 {
			if _, statErr := os.Stat(path); statErr != nil {
				return 0 // killed before the file existed
			}
		}
		t.Fatalf("round %d: reopen after kill: %v", round, err)
	}
	defer s.Close()
	ctx := context.Background()
	byPos := map[string]map[uint64]eventlog.Event{}
	var total uint64
	for g := range crashStreams {
		stream := fmt.Sprintf("session/crash-%d", g)
		b, err := s.Bounds(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		pos := map[uint64]eventlog.Event{}
		byPos[stream] = pos
		next := uint64(1)
		for next <= b.Head {
			evs, err := s.Read(ctx, stream, next, 1000)
			if err != nil {
				t.Fatalf("round %d: read %s at %d: %v", round, stream, next, err)
			}
			for _, ev := range evs {
				if ev.Seq != next {
					t.Fatalf("round %d: %s: position %d follows %d", round, stream, ev.Seq, next-1)
				}
				pos[ev.Seq] = ev
				next++
			}
			if len(evs) == 0 {
				t.Fatalf("round %d: %s: nothing at %d, head %d", round, stream, next, b.Head)
			}
		}
		total += b.Head
		// Every batch in the log is whole: events i = 0..n-1 of batch B
		// sit at consecutive positions, with the content the child wrote.
		for seq := uint64(1); seq <= b.Head; {
			var p crashPayload
			if err := json.Unmarshal(pos[seq].Payload, &p); err != nil {
				t.Fatalf("round %d: %s/%d: %v", round, stream, seq, err)
			}
			for i := range p.N {
				ev, ok := pos[seq+uint64(i)]
				var q crashPayload
				if ok {
					json.Unmarshal(ev.Payload, &q)
				}
				want := crashPayload{p.Batch, i, p.N, crashPad(p.Batch, i)}
				if !ok || q != want || ev.ID != fmt.Sprintf("%s/%d", p.Batch, i) {
					t.Fatalf("round %d (seed %d): %s: batch %s of %d starting at %d is torn at %d: %+v", round, seed, stream, p.Batch, p.N, seq, seq+uint64(i), q)
				}
			}
			seq += uint64(p.N)
		}
	}
	for _, a := range acked {
		for seq := a.first; seq <= a.last; seq++ {
			ev, ok := byPos[a.stream][seq]
			if !ok || ev.ID != fmt.Sprintf("%s/%d", a.batch, seq-a.first) {
				t.Fatalf("round %d (seed %d): acknowledged append %s at %s %d..%d lost: position %d holds %q", round, seed, a.batch, a.stream, a.first, a.last, seq, ev.ID)
			}
		}
	}
	return total
}
