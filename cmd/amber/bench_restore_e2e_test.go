package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// TestBenchRestore is `make bench-restore` (docs/benchmarks.md, "Restore to
// running"): every stack side by side on one workload, interleaved round
// by round, so that each Amber figure stands beside the raw runtime's from
// the same minutes of the same machine.
//
// The workload (testdata/ticker) fills N MiB with a pseudo-random pattern,
// then prints a CLOCK_REALTIME stamp every 10 ms. A round, on each stack:
// a cut that leaves the workload running; a kill, and the sandbox's cgroup
// verified empty; optionally drop_caches; the restore. Figures:
//
//   - frozen: the largest gap between the workload's ticks across the cut,
//     minus the 10 ms period (not the runtime's own account);
//   - to running: from the start of the restore call to the first tick
//     stamped after it;
//   - call: the restore call's own duration (for Amber, the REST call);
//   - after every restore the workload checks all its memory against the
//     pattern (SIGUSR1) and must answer "ok" with the PID it had.
//
// Stacks: raw `runsc checkpoint/restore` (the gvisor driver's file flags,
// no network), raw `runc checkpoint/restore` with the cache's CRIU, raw runc
// with CRIU lazy pages, and Amber's gvisor and criu drivers through a daemon
// on REST, each hot (the node's hot copy) and cold (a daemon with
// --hot-tier off: every restore fetches from the chunk store on MinIO);
// Amber's restores are lazy, and amber-{gvisor,criu}-{hot,cold}-eager are
// the same with --lazy-restore=false; runsc-bg is raw `runsc restore
// --background` (neither in the default set).
// Amber is timed only from this process, never inside the daemon.
//
// Knobs: AMBER_BENCH_SIZES (MiB, default 64,256,1024), AMBER_BENCH_N
// (rounds, default 5), AMBER_BENCH_STACKS (a subset of stack names),
// AMBER_BENCH_CACHES ("warm,dropped" by default).
//
// The stacks named sqlite-… run first and are another benchmark: the
// sandbox's own speed on a SQLite setup (bench_sqlite_e2e_test.go), their
// table appended to the report.
func TestBenchRestore(t *testing.T) {
	if os.Getenv("AMBER_BENCH_RESTORE") == "" {
		t.Skip("set AMBER_BENCH_RESTORE=1 (make bench-restore)")
	}
	sizes := envInts(t, "AMBER_BENCH_SIZES", []int{64, 256, 1024})
	rounds := envInts(t, "AMBER_BENCH_N", []int{5})[0]
	caches := envList("AMBER_BENCH_CACHES", []string{"warm", "dropped"})
	all := envList("AMBER_BENCH_STACKS", append([]string{"runsc", "runc", "runc-lazy", "amber-gvisor-hot", "amber-gvisor-cold", "amber-criu-hot", "amber-criu-cold"}, sqliteDefaultStacks...))
	var names, sqliteNames []string
	for _, n := range all {
		if strings.HasPrefix(n, "sqlite-") {
			sqliteNames = append(sqliteNames, n)
		} else {
			names = append(names, n)
		}
	}
	bin, dir := e2eSetup(t)
	sqliteReport := benchSQLite(t, bin, dir, sqliteNames) // bench_sqlite_e2e_test.go
	if len(names) == 0 {
		writeBenchReport(t, sqliteReport)
		return
	}
	ticker := filepath.Join(dir, "ticker")
	build := exec.Command("go", "build", "-trimpath", "-o", ticker, "./testdata/ticker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the ticker: %v\n%s", err, out)
	}
	stacks := benchStacks(t, bin, dir, ticker, names)
	t.Logf("load at the start: %s", loadAvg())
	var table []benchRow
	for _, size := range sizes {
		for _, s := range stacks {
			if err := s.start(size); err != nil {
				t.Fatalf("%s: start the %d MiB workload: %v", s.name(), size, err)
			}
		}
		samples := map[string][]benchSample{}
		for r := 1; r <= rounds; r++ {
			for _, cache := range caches {
				for _, s := range stacks {
					smp, err := benchRound(s, cache == "dropped")
					if err != nil {
						t.Fatalf("%s, %d MiB, round %d (%s): %v", s.name(), size, r, cache, err)
					}
					key := s.name() + "/" + cache
					samples[key] = append(samples[key], smp)
					t.Logf("%-18s %4d MiB %-7s round %d: frozen %v, to running %v, call %v, cut %v",
						s.name(), size, cache, r, smp.frozen, smp.running, smp.call, smp.cut)
				}
			}
		}
		for _, s := range stacks {
			if a, ok := s.(*amberStack); ok {
				t.Logf("%s %d MiB: %s", a.label, size, a.restoreKinds())
			}
			s.stop()
		}
		for _, cache := range caches {
			for _, s := range stacks {
				table = append(table, newBenchRow(s.name(), size, cache, samples[s.name()+"/"+cache]))
			}
		}
		t.Logf("load after %d MiB: %s", size, loadAvg())
	}
	report := formatBenchTable(table)
	t.Logf("restore to running, %d rounds, load at the end %s\n%s", rounds, loadAvg(), report)
	if sqliteReport != "" {
		report += "\n" + sqliteReport
	}
	writeBenchReport(t, report)
}

// writeBenchReport logs the report and writes it to AMBER_BENCH_OUT.
func writeBenchReport(t *testing.T, report string) {
	t.Logf("report:\n%s", report)
	if out := os.Getenv("AMBER_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// benchStack is one runtime under test, holding one workload at a time.
type benchStack interface {
	name() string
	// start creates a sandbox running the ticker over size MiB.
	start(size int) error
	// cut checkpoints, leaving the workload running.
	cut() error
	// kill ends the sandbox and returns once its cgroup is empty.
	kill() error
	// restore brings the last cut back.
	restore() error
	// output is everything the workload printed so far (as the stack
	// keeps it: the restored sandbox's, after a restore).
	output() (string, error)
	// signal sends SIGUSR1 to the workload.
	signal() error
	stop()
}

type benchSample struct {
	frozen, running, call, cut time.Duration
}

// benchRound runs one round on s (see TestBenchRestore).
func benchRound(s benchStack, dropCaches bool) (benchSample, error) {
	var smp benchSample
	out, err := waitOutput(s, 10*time.Second, func(o string) bool { return countLines(o, "tick ") >= 20 })
	if err != nil {
		return smp, fmt.Errorf("before the cut: %w", err)
	}
	pid := readyPID(out)
	cutAt := time.Now()
	if err := s.cut(); err != nil {
		return smp, fmt.Errorf("cut: %w", err)
	}
	smp.cut = time.Since(cutAt)
	cutEnd := time.Now()
	// Ticks after the cut show it resumed; the gap is measured on them.
	out, err = waitOutput(s, 30*time.Second, func(o string) bool { return lastTick(o).After(cutEnd.Add(100 * time.Millisecond)) })
	if err != nil {
		return smp, fmt.Errorf("after the cut: %w", err)
	}
	smp.frozen = max(0, largestGap(out, cutAt.Add(-time.Second), cutEnd.Add(100*time.Millisecond))-10*time.Millisecond)
	if err := s.kill(); err != nil {
		return smp, fmt.Errorf("kill: %w", err)
	}
	if dropCaches {
		if err := exec.Command("sync").Run(); err != nil {
			return smp, err
		}
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200); err != nil {
			return smp, fmt.Errorf("drop caches: %w", err)
		}
	}
	start := time.Now()
	if err := s.restore(); err != nil {
		return smp, fmt.Errorf("restore: %w", err)
	}
	smp.call = time.Since(start)
	out, err = waitOutput(s, 2*time.Minute, func(o string) bool { return lastTick(o).After(start) })
	if err != nil {
		return smp, fmt.Errorf("after the restore: %w", err)
	}
	smp.running = firstTickAfter(out, start).Sub(start)
	verified := countLines(out, "verify ")
	if err := s.signal(); err != nil {
		return smp, fmt.Errorf("signal: %w", err)
	}
	out, err = waitOutput(s, 2*time.Minute, func(o string) bool { return countLines(o, "verify ") > verified })
	if err != nil {
		return smp, fmt.Errorf("memory check after the restore: %w", err)
	}
	if want := fmt.Sprintf("verify ok %d ", pid); !strings.Contains(lastLine(out, "verify "), want) {
		return smp, fmt.Errorf("memory check after the restore: %q, want %q (the same process, every byte intact)", lastLine(out, "verify "), want)
	}
	return smp, nil
}

// waitOutput polls s's output until done holds.
func waitOutput(s interface{ output() (string, error) }, limit time.Duration, done func(string) bool) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		out, err := s.output()
		if err == nil && done(out) {
			return out, nil
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("not within %v (last error %v; output ends %q)", limit, err, tail(out, 3))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countLines(out, prefix string) int {
	n := 0
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func lastLine(out, prefix string) string {
	last := ""
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, prefix) {
			last = strings.TrimSpace(l)
		}
	}
	return last
}

func readyPID(out string) int {
	f := strings.Fields(lastLine(out, "ready "))
	if len(f) < 2 {
		return -1
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// ticks are the stamps of the workload's complete tick lines, in order.
func ticks(out string) []time.Time {
	var ts []time.Time
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "tick" || !strings.HasSuffix(l, "\n") {
			continue
		}
		if ns, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			ts = append(ts, time.Unix(0, ns))
		}
	}
	return ts
}

func lastTick(out string) time.Time {
	var last time.Time
	for _, ts := range ticks(out) {
		if ts.After(last) {
			last = ts
		}
	}
	return last
}

func firstTickAfter(out string, t0 time.Time) time.Time {
	var first time.Time
	for _, ts := range ticks(out) {
		if ts.After(t0) && (first.IsZero() || ts.Before(first)) {
			first = ts
		}
	}
	return first
}

// largestGap is the largest gap between consecutive ticks stamped in
// [from, to].
func largestGap(out string, from, to time.Time) time.Duration {
	var in []time.Time
	for _, ts := range ticks(out) {
		if !ts.Before(from) && !ts.After(to) {
			in = append(in, ts)
		}
	}
	slices.SortFunc(in, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(in); i++ {
		gap = max(gap, in[i].Sub(in[i-1]))
	}
	return gap
}

// cgroupHolds checks that the cgroup at path holds processes: run before
// a kill, it proves cgroupEmpty afterwards looks at the right cgroup.
func cgroupHolds(path string) error {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", path, "cgroup.procs"))
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return fmt.Errorf("the sandbox's cgroup %s holds no process before the kill (%v): the benchmark looks in the wrong place", path, err)
	}
	return nil
}

// cgroupEmpty waits until no process is left in the cgroup at path (the
// pids hierarchy; a removed cgroup is empty).
func cgroupEmpty(path string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", path, "cgroup.procs"))
		if os.IsNotExist(err) || (err == nil && len(bytes.TrimSpace(b)) == 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds %q 30s after the kill", path, bytes.TrimSpace(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func envInts(t *testing.T, key string, dflt []int) []int {
	v := os.Getenv(key)
	if v == "" {
		return dflt
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want positive numbers separated by commas", key, v)
		}
		out = append(out, n)
	}
	return out
}

func envList(key string, dflt []string) []string {
	if v := os.Getenv(key); v != "" {
		return strings.Split(v, ",")
	}
	return dflt
}

// benchStacks builds the stacks named: the daemons the Amber ones need (a
// MinIO chunk store, no warm pool) and the raw runtimes' bundles.
func benchStacks(t *testing.T, bin, dir, ticker string, names []string) []benchStack {
	var stacks []benchStack
	var s3 []string
	for _, n := range names {
		switch n {
		case "runsc", "runsc-bg":
			stacks = append(stacks, newRawRunsc(t, dir, ticker, n == "runsc-bg"))
		case "runc", "runc-lazy":
			stacks = append(stacks, newRawRunc(t, dir, ticker, n == "runc-lazy"))
		case "amber-gvisor-hot", "amber-gvisor-cold", "amber-criu-hot", "amber-criu-cold",
			"amber-gvisor-hot-eager", "amber-gvisor-cold-eager", "amber-criu-hot-eager", "amber-criu-cold-eager":
			if s3 == nil {
				s3 = minioBlobs(t, "bench")
			}
			f := strings.Split(n, "-")
			args := append([]string{"--driver", f[1], "--pool", "0", "--egress=false"}, s3...)
			if f[2] == "cold" {
				args = append(args, "--hot-tier", "off")
			}
			if len(f) == 4 { // -eager: the driver's restores load all memory first
				args = append(args, "--lazy-restore=false")
			}
			d := startDaemon(t, bin, filepath.Join(dir, n), freeAddr(t), args...)
			cl := d.adminClient()
			a := &amberStack{label: n, driver: f[1], cl: cl, ticker: ticker}
			t.Cleanup(a.stop) // before the daemon stops (cleanups run last first)
			stacks = append(stacks, a)
		default:
			t.Fatalf("AMBER_BENCH_STACKS: unknown stack %q", n)
		}
	}
	return stacks
}

// amberStack is Amber through a daemon's REST API.
type amberStack struct {
	label, driver string
	cl            *client.Client
	ticker        string
	id            string
	pid           int
	out           []byte
	offset        int64
}

func (a *amberStack) name() string { return a.label }

func (a *amberStack) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Minute)
}

func (a *amberStack) start(size int) error {
	ctx, cancel := a.ctx()
	defer cancel()
	sb, err := a.cl.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true,
		Limits: api.Limits{MemoryBytes: int64(size+256) << 20}})
	if err != nil {
		return err
	}
	a.id, a.out, a.offset = sb.ID, nil, 0
	f, err := os.Open(a.ticker)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := a.cl.WriteFile(ctx, a.id, "/root/ticker", f, 0o755); err != nil {
		return err
	}
	a.pid, err = a.cl.StartProcess(ctx, a.id, api.StartProcessRequest{Args: []string{"/root/ticker", strconv.Itoa(size), strconv.FormatUint(rand.Uint64()|1, 10)}})
	if err != nil {
		return err
	}
	_, err = waitOutput(a, 5*time.Minute, func(o string) bool { return strings.Contains(o, "ready ") })
	return err
}

func (a *amberStack) cut() error {
	ctx, cancel := a.ctx()
	defer cancel()
	_, err := a.cl.Checkpoint(ctx, a.id, api.CreateCheckpointRequest{}, nil)
	return err
}

func (a *amberStack) kill() error {
	ctx, cancel := a.ctx()
	defer cancel()
	if err := cgroupHolds(filepath.Join("amber", a.driver, a.id)); err != nil {
		return err
	}
	if _, err := a.cl.KillSandbox(ctx, a.id); err != nil {
		return err
	}
	return cgroupEmpty(filepath.Join("amber", a.driver, a.id))
}

func (a *amberStack) restore() error {
	ctx, cancel := a.ctx()
	defer cancel()
	_, err := a.cl.Recover(ctx, a.id, api.RecoverRequest{}, nil)
	return err
}

// output reads the process's output from where it left off. out holds
// the stream's bytes up to offset; a rewind (the restored ring is as of the
// cut) or a frame from before offset cuts the copy back first.
func (a *amberStack) output() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	back := func(to int64) {
		if cut := a.offset - to; cut > 0 {
			a.out = a.out[:max(0, int64(len(a.out))-cut)]
			a.offset = to
		}
	}
	err := a.cl.ProcessOutput(ctx, a.id, a.pid, a.offset, false, func(f api.OutputFrame) error {
		switch f.Stream {
		case "rewound":
			back(f.Offset)
		case "stdout", "stderr":
			back(f.Offset)
			a.out = append(a.out, f.Data...)
			a.offset = f.Offset + int64(len(f.Data))
		}
		return nil
	})
	return string(a.out), err
}

// restoreKinds counts the sandbox's restores by kind, from its
// sandbox.restored events: which path the daemon took (lazy, hot).
func (a *amberStack) restoreKinds() string {
	ctx, cancel := a.ctx()
	defer cancel()
	var n, lazy, hot int
	for from := uint64(0); ; {
		el, err := a.cl.Events(ctx, a.id, from, 500)
		if err != nil {
			return "events: " + err.Error()
		}
		for _, ev := range el.Events {
			var p struct{ Lazy, Hot bool }
			if ev.Type == "sandbox.restored" && json.Unmarshal(ev.Payload, &p) == nil {
				n++
				lazy += b2i(p.Lazy)
				hot += b2i(p.Hot)
			}
		}
		if len(el.Events) == 0 || el.Next <= from {
			break
		}
		from = el.Next
	}
	return fmt.Sprintf("%d restores: %d lazy, %d hot", n, lazy, hot)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (a *amberStack) signal() error {
	ctx, cancel := a.ctx()
	defer cancel()
	return a.cl.Signal(ctx, a.id, a.pid, "USR1")
}

func (a *amberStack) stop() {
	if a.id == "" {
		return
	}
	ctx, cancel := a.ctx()
	defer cancel()
	_ = a.cl.DeleteSandbox(ctx, a.id)
	a.id = ""
}

// benchRow is one line of the report: medians (and the p99, the maximum
// of so few samples) of one stack, size and cache state.
type benchRow struct {
	stack, cache string
	size, n      int
	frozen, run  [2]time.Duration // p50, max
	call         time.Duration
}

func newBenchRow(stack string, size int, cache string, s []benchSample) benchRow {
	pick := func(f func(benchSample) time.Duration) [2]time.Duration {
		var v []time.Duration
		for _, x := range s {
			v = append(v, f(x))
		}
		slices.Sort(v)
		if len(v) == 0 {
			return [2]time.Duration{}
		}
		return [2]time.Duration{v[len(v)/2], v[len(v)-1]}
	}
	return benchRow{stack: stack, cache: cache, size: size, n: len(s),
		frozen: pick(func(x benchSample) time.Duration { return x.frozen }),
		run:    pick(func(x benchSample) time.Duration { return x.running }),
		call:   pick(func(x benchSample) time.Duration { return x.call })[0]}
}

// formatBenchTable prints the rows as a Markdown table, each Amber row
// with its ratio to the raw runtime of its driver (runsc for gvisor, runc
// with CRIU for criu) at the same size and cache state.
func formatBenchTable(rows []benchRow) string {
	raw := map[string]benchRow{}
	for _, r := range rows {
		raw[fmt.Sprintf("%s/%d/%s", r.stack, r.size, r.cache)] = r
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Round(time.Millisecond).Milliseconds(), 10) }
	var b strings.Builder
	b.WriteString("| stack | MiB | cache | n | to running p50 / max (ms) | restore call p50 (ms) | frozen p50 / max (ms) | to running ÷ raw |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ratio := ""
		base := ""
		switch {
		case strings.HasPrefix(r.stack, "amber-gvisor"):
			base = "runsc"
		case strings.HasPrefix(r.stack, "amber-criu"):
			base = "runc"
		}
		if br, ok := raw[fmt.Sprintf("%s/%d/%s", base, r.size, r.cache)]; ok && br.run[0] > 0 {
			ratio = fmt.Sprintf("%.2f (÷ %s)", float64(r.run[0])/float64(br.run[0]), base)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %s / %s | %s | %s / %s | %s |\n", r.stack, r.size, r.cache, r.n,
			ms(r.run[0]), ms(r.run[1]), ms(r.call), ms(r.frozen[0]), ms(r.frozen[1]), ratio)
	}
	return b.String()
}

// adminClient is a REST client of d with its admin key.
func (d *daemon) adminClient() *client.Client {
	d.t.Helper()
	key, err := os.ReadFile(filepath.Join(d.dataDir, "admin.key"))
	if err != nil {
		d.t.Fatal(err)
	}
	cl, err := client.New(d.addr, strings.TrimSpace(string(key)))
	if err != nil {
		d.t.Fatal(err)
	}
	return cl
}
