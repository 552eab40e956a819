package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// benchWorkload is the agent-like state the checkpoint benchmark restores:
// a Python process that imports a handful of standard modules, fills
// argv[1] MiB with random bytes (incompressible, nothing to deduplicate),
// prints "ready" and the buffer's CRC, and then waits. Touching /root/poke
// rewrites 1 MiB of the buffer at a random offset (the small change
// between checkpoints); touching /root/verify prints the CRC again.
const benchWorkload = `
import os, sys, time, zlib, json, sqlite3, decimal, asyncio, email.parser, http.client, xml.etree.ElementTree
n = int(sys.argv[1]) << 20
buf = bytearray(n)
c = 16 << 20
for i in range(0, n, c):
    buf[i:i + c] = os.urandom(min(c, n - i))
print("ready", zlib.crc32(buf), flush=True)
while True:
    time.sleep(0.05)
    if os.path.exists("/root/poke"):
        os.remove("/root/poke")
        off = int.from_bytes(os.urandom(4), "little") % max(1, n - (1 << 20))
        buf[off:off + (1 << 20)] = os.urandom(min(1 << 20, n))
        print("poked", flush=True)
    if os.path.exists("/root/verify"):
        os.remove("/root/verify")
        print("crc", zlib.crc32(buf), flush=True)
`

// ckptBench is one size's figures.
type ckptBench struct {
	mib  int
	fail string // why this size did not complete, if it did not

	image, stored1                  int64 // first checkpoint: image and stored bytes
	frozen1, total1                 time.Duration
	incStored                       []int64 // later checkpoints, each after a 1 MiB change
	incNew                          []int
	frozen, total                   []time.Duration // the later checkpoints
	restore, restoreExec            []time.Duration // Engine.Restore (from the node's hot copy); then an exec that sees the process
	coldRestore                     []time.Duration // Engine.Restore of the same checkpoint with its hot copy dropped (fetched from the chunk store)
	fetch, drvRunning               []time.Duration // from the sandbox.restored event
	rawFrozen, rawTotal, rawRestore []time.Duration // the driver without the chunk store
	rawRestoreExec, lazy, lazyExec  []time.Duration
	lazyNote                        string
	cold, coldCreate                []time.Duration // cold create + setup until ready; create alone
	setup                           time.Duration   // the measured sandbox's own setup
}

// TestBenchCheckpoint is the engine-level checkpoint and restore report
// (issue 4): for 10 MiB, 256 MiB and 1 GiB of touched memory in a Python
// process of the python template, on the driver under test, it measures
// a first checkpoint (frozen, total, bytes stored), then N rounds of
// {1 MiB change, incremental checkpoint, kill, Engine.Restore in place};
// then, on the same sandbox, N rounds of the driver's own checkpoint and
// restore without the chunk store (and its lazy restore where the driver
// can); then N cold creates of the same template plus the workload's
// setup. The restored memory is checked by CRC once per size. It runs only
// with AMBER_BENCH=1 (N from AMBER_BENCH_N, default 5; sizes in MiB from
// AMBER_BENCH_SIZES, default "10,256,1024"):
//
//	AMBER_BENCH=1 go test -tags seccomp -count=1 -run TestBenchCheckpoint -v -timeout 60m ./internal/engine
//	AMBER_BENCH=1 AMBER_TEST_DRIVER=criu go test -tags seccomp -count=1 -run TestBenchCheckpoint -v -timeout 60m ./internal/engine
func TestBenchCheckpoint(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the checkpoint benchmark")
	}
	n := 5
	if v, err := strconv.Atoi(os.Getenv("AMBER_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	sizes := []int{10, 256, 1024}
	if s := os.Getenv("AMBER_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || v <= 0 {
				t.Fatalf("AMBER_BENCH_SIZES=%q: %q is not a size in MiB", s, f)
			}
			sizes = append(sizes, v)
		}
	}
	env := enginetest.New(t, engine.Options{Recovery: engine.RecoveryOptions{KeepCheckpoints: 2}})
	if _, err := env.Catalog.Get("python"); err != nil {
		t.Skipf("template python is not installed (scripts/setup/python-template.sh): %v", err)
	}
	var results []*ckptBench
	for _, mib := range sizes {
		r := &ckptBench{mib: mib}
		results = append(results, r)
		start := time.Now()
		ok := t.Run(fmt.Sprintf("%dMiB", mib), func(t *testing.T) { benchCheckpointSize(t, env, r, n) })
		if !ok && r.fail == "" {
			r.fail = "failed (see the log above)"
		}
		t.Logf("%d MiB took %v", mib, time.Since(start).Round(time.Second))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("BENCH checkpoint driver=%s n=%d load=%s\n", enginetest.DriverName(), n, strings.Join(strings.Fields(string(load))[:3], " "))
	for _, r := range results {
		fmt.Println("BENCH", r.summary())
	}
	fmt.Println(markdownTable(results))
}

func benchCheckpointSize(t *testing.T, env *enginetest.Env, r *ckptBench, n int) {
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	fail := func(format string, args ...any) {
		t.Helper()
		r.fail = fmt.Sprintf(format, args...)
		t.Fatal(r.fail)
	}
	// Room for the buffer, Python and the page cache.
	limits := sandbox.Limits{MemoryBytes: int64(2*r.mib+512) << 20}
	args := []string{"python3", "-c", benchWorkload, strconv.Itoa(r.mib)}

	t0 := time.Now()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "python", Limits: limits, Cold: true})
	if err != nil {
		fail("create: %v", err)
	}
	id := sb.ID
	t.Cleanup(func() { _ = e.Destroy(context.Background(), "default", id) })
	pid, err := e.StartProcess(ctx, "default", id, sandbox.ExecSpec{Args: args})
	if err != nil {
		fail("start workload: %v", err)
	}
	logf := fmt.Sprintf("/run/amber/proc/%d.log", pid)
	if err := waitLine(ctx, e, id, logf, "ready", 1); err != nil {
		fail("setup: %v", err)
	}
	r.setup = time.Since(t0)

	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		fail("first checkpoint: %v", err)
	}
	r.image, r.stored1 = ck.Stats.ImageBytes, ck.Stats.StoredBytes
	r.frozen1, r.total1 = time.Duration(ck.Stats.FrozenNS), time.Duration(ck.Stats.TotalNS)
	t.Logf("first checkpoint: %+v", ck.Stats)

	var crc string
	for i := 0; i < n; i++ {
		if err := touch(ctx, e, id, "/root/poke"); err != nil {
			fail("poke: %v", err)
		}
		if err := waitLine(ctx, e, id, logf, "poked", i+1); err != nil {
			fail("round %d: %v", i, err)
		}
		if i == 0 {
			if crc, err = askCRC(ctx, e, id, logf, 1); err != nil {
				fail("crc before the cut: %v", err)
			}
		}
		ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
		if err != nil {
			fail("checkpoint %d: %v", i+2, err)
		}
		r.frozen = append(r.frozen, time.Duration(ck.Stats.FrozenNS))
		r.total = append(r.total, time.Duration(ck.Stats.TotalNS))
		r.incStored = append(r.incStored, ck.Stats.StoredBytes)
		r.incNew = append(r.incNew, ck.Stats.NewChunks)
		e.WaitHotTier() // the hot copy is made after the checkpoint returns
		if _, err := e.Kill(ctx, "default", id); err != nil {
			fail("kill: %v", err)
		}
		// Out of the timing, as for the driver-only restores: the
		// killed sandbox is gone.
		if err := waitStopped(ctx, env.Driver, id); err != nil {
			fail("%v", err)
		}
		t0 := time.Now()
		if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
			fail("restore %d: %v", i, err)
		}
		r.restore = append(r.restore, time.Since(t0))
		if err := alive(ctx, e, id, pid, logf); err != nil {
			fail("after restore %d: %v", i, err)
		}
		r.restoreExec = append(r.restoreExec, time.Since(t0))
		if p, err := lastRestored(ctx, e, id); err == nil {
			r.fetch = append(r.fetch, time.Duration(p.FetchNS))
			r.drvRunning = append(r.drvRunning, time.Duration(p.RunningNS))
			if !p.Hot {
				t.Errorf("restore %d did not start from the hot copy", i)
			}
		} else {
			t.Errorf("restored event: %v", err)
		}
		// The same restore from the chunk store: the hot copy dropped.
		e.WaitHotTier()
		if _, err := e.Kill(ctx, "default", id); err != nil {
			fail("kill: %v", err)
		}
		if err := waitStopped(ctx, env.Driver, id); err != nil {
			fail("%v", err)
		}
		e.DropHotCopy(ck.ID)
		t0 = time.Now()
		if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
			fail("cold restore %d: %v", i, err)
		}
		r.coldRestore = append(r.coldRestore, time.Since(t0))
		if err := alive(ctx, e, id, pid, logf); err != nil {
			fail("after cold restore %d: %v", i, err)
		}
		if i == 0 {
			got, err := askCRC(ctx, e, id, logf, 2)
			if err != nil {
				fail("crc after restore: %v", err)
			}
			if got != crc {
				fail("memory after restore has CRC %s, at the cut %s: not the same memory", got, crc)
			}
		}
	}
	t.Logf("engine rounds done: restore %v", r.restore)

	benchRawDriver(t, ctx, env, r, n, id, pid, logf, sb.Limits, fail)

	if err := e.Destroy(ctx, "default", id); err != nil {
		fail("destroy: %v", err)
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "python", Limits: limits, Cold: true})
		if err != nil {
			fail("cold create %d: %v", i, err)
		}
		created := time.Since(t0)
		t.Cleanup(func() { _ = e.Destroy(context.Background(), "default", c.ID) })
		cpid, err := e.StartProcess(ctx, "default", c.ID, sandbox.ExecSpec{Args: args})
		if err != nil {
			fail("cold start workload: %v", err)
		}
		if err := waitLine(ctx, e, c.ID, fmt.Sprintf("/run/amber/proc/%d.log", cpid), "ready", 1); err != nil {
			fail("cold setup: %v", err)
		}
		r.cold, r.coldCreate = append(r.cold, time.Since(t0)), append(r.coldCreate, created)
		if err := e.Destroy(ctx, "default", c.ID); err != nil {
			fail("destroy cold: %v", err)
		}
	}
	t.Log(r.summary())
}

// benchRawDriver checkpoints and restores sandbox id with the driver alone
// (no chunk store, no metadata), as the engine would: cut, kill, restore.
// The engine's rows are not told; the sandbox runs again afterwards.
func benchRawDriver(t *testing.T, ctx context.Context, env *enginetest.Env, r *ckptBench, n int, id string, pid int, logf string, limits sandbox.Limits, fail func(string, ...any)) {
	t.Helper()
	cp, ok := env.Driver.(sandbox.Checkpointer)
	if !ok {
		fail("driver %s is no Checkpointer", env.Driver.Name())
	}
	tmpl, err := env.Catalog.Get("python")
	if err != nil {
		fail("%v", err)
	}
	spec := sandbox.Spec{ID: id, Tenant: "default", Template: tmpl, Limits: limits}
	lazyCap := env.Driver.Capabilities().LazyRestore
	switch {
	case lazyCap:
	case env.Driver.Name() == "criu":
		b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
		r.lazyNote = fmt.Sprintf("off: vm.unprivileged_userfaultfd=%s (criu lazy-pages needs 1, or the patched CRIU with /dev/userfaultfd: the driver's LazyRestore)", strings.TrimSpace(string(b)))
	default:
		r.lazyNote = fmt.Sprintf("driver %s has no lazy restore", env.Driver.Name())
	}
	rounds := n
	if lazyCap {
		rounds = 2 * n // alternate eager and lazy restores
	}
	for i := 0; i < rounds; i++ {
		dir, err := os.MkdirTemp(env.Dir, "raw-")
		if err != nil {
			fail("%v", err)
		}
		img := filepath.Join(dir, "img")
		t0 := time.Now()
		cs, err := cp.Checkpoint(ctx, id, img, sandbox.CheckpointOptions{})
		if err != nil {
			fail("driver checkpoint: %v", err)
		}
		total := time.Since(t0)
		if err := killDriver(ctx, env.Driver, id); err != nil {
			fail("%v", err)
		}
		lazy := lazyCap && i%2 == 1
		t0 = time.Now()
		rs, err := cp.Restore(ctx, spec, img, sandbox.RestoreOptions{Lazy: lazy})
		if err != nil {
			fail("driver restore (lazy %t): %v", lazy, err)
		}
		d := time.Since(t0)
		if err := alive(ctx, env.Engine, id, pid, logf); err != nil {
			fail("after driver restore (lazy %t): %v", lazy, err)
		}
		de := time.Since(t0)
		os.RemoveAll(dir)
		if lazy {
			if !rs.Lazy {
				r.lazyNote = "driver restored eagerly although asked for lazy"
			}
			r.lazy, r.lazyExec = append(r.lazy, d), append(r.lazyExec, de)
			continue
		}
		r.rawFrozen, r.rawTotal = append(r.rawFrozen, cs.Frozen), append(r.rawTotal, total)
		r.rawRestore, r.rawRestoreExec = append(r.rawRestore, d), append(r.rawRestoreExec, de)
	}
}

// killDriver kills sandbox id through the driver and waits until it is
// stopped (what the engine does before a restore in place).
func killDriver(ctx context.Context, d sandbox.Driver, id string) error {
	if err := d.Kill(ctx, id); err != nil {
		return fmt.Errorf("driver kill: %w", err)
	}
	return waitStopped(ctx, d, id)
}

// waitStopped waits until the driver no longer reports sandbox id running.
func waitStopped(ctx context.Context, d sandbox.Driver, id string) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		in, err := d.Inspect(ctx, id)
		if err != nil || in.State != sandbox.StateRunning {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s still runs 30s after SIGKILL", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shExec runs a shell command in the sandbox and returns its output.
func shExec(ctx context.Context, e *engine.Engine, id, script string) (string, error) {
	var out strings.Builder
	st, err := e.Exec(ctx, "default", id, sandbox.ExecSpec{Args: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil {
		return "", err
	}
	if st.Code != 0 {
		return out.String(), fmt.Errorf("%q exited %d: %s", script, st.Code, out.String())
	}
	return out.String(), nil
}

func touch(ctx context.Context, e *engine.Engine, id, path string) error {
	_, err := shExec(ctx, e, id, "touch "+path)
	return err
}

// waitLine waits, inside the sandbox (one exec), until log holds count
// lines starting with word.
func waitLine(ctx context.Context, e *engine.Engine, id, log, word string, count int) error {
	_, err := shExec(ctx, e, id, fmt.Sprintf(
		`i=0; while [ "$(grep -c '^%s' %s 2>/dev/null)" -lt %d ]; do i=$((i+1)); if [ $i -gt 30000 ]; then tail -n 5 %[2]s; exit 1; fi; sleep 0.01; done`,
		word, log, count))
	return err
}

// askCRC has the workload print its buffer's CRC (the count-th time) and
// returns it.
func askCRC(ctx context.Context, e *engine.Engine, id, log string, count int) (string, error) {
	if err := touch(ctx, e, id, "/root/verify"); err != nil {
		return "", err
	}
	if err := waitLine(ctx, e, id, log, "crc", count); err != nil {
		return "", err
	}
	out, err := shExec(ctx, e, id, "grep '^crc' "+log+" | tail -n 1")
	return strings.TrimSpace(out), err
}

// alive checks, in one exec, that the workload runs and had set up.
func alive(ctx context.Context, e *engine.Engine, id string, pid int, log string) error {
	_, err := shExec(ctx, e, id, fmt.Sprintf("kill -0 %d && grep -q '^ready' %s", pid, log))
	return err
}

// lastRestored returns the payload of sandbox id's newest sandbox.restored
// event.
func lastRestored(ctx context.Context, e *engine.Engine, id string) (engine.RestoredPayload, error) {
	var p engine.RestoredPayload
	found := false
	for from := uint64(1); ; {
		evs, err := e.Events(ctx, "default", id, from, 500)
		if err != nil {
			return p, err
		}
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.Type == engine.EventRestored {
				if err := json.Unmarshal(ev.Payload, &p); err != nil {
					return p, err
				}
				found = true
			}
		}
		from = evs[len(evs)-1].Seq + 1
	}
	if !found {
		return p, fmt.Errorf("sandbox %s has no %s event", id, engine.EventRestored)
	}
	return p, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// q is pct that answers 0 for no samples.
func q(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return pct(ds, p)
}

// median of counts (nearest rank, lower).
func median[T int | int64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := append([]T(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)/2]
}

func ratio(a, b time.Duration) string {
	if a == 0 || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

func ms(d time.Duration) string {
	if d == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}

func (r *ckptBench) summary() string {
	if r.fail != "" && len(r.restore) == 0 {
		return fmt.Sprintf("%d MiB: FAILED: %s", r.mib, r.fail)
	}
	s := fmt.Sprintf("%d MiB: setup %s; ckpt#1 frozen %s total %s image %s stored %s; "+
		"incremental (n=%d) frozen p50 %s total p50 %s stored p50 %s new chunks p50 %d; "+
		"restore p50 %s p99 %s (+exec p50 %s p99 %s; fetch p50 %s, driver p50 %s); cold restore (chunk store) p50 %s; "+
		"driver-only frozen p50 %s ckpt p50 %s restore p50 %s p99 %s (+exec p50 %s); lazy %s; "+
		"cold create+setup p50 %s p99 %s (create p50 %s); "+
		"ratios: restore+exec/cold %s, restore/driver-only %s, frozen/driver-only %s",
		r.mib, ms(r.setup), ms(r.frozen1), ms(r.total1), mib(r.image), mib(r.stored1),
		len(r.frozen), ms(q(r.frozen, 50)), ms(q(r.total, 50)), mib(median(r.incStored)), median(r.incNew),
		ms(q(r.restore, 50)), ms(q(r.restore, 99)), ms(q(r.restoreExec, 50)), ms(q(r.restoreExec, 99)),
		ms(q(r.fetch, 50)), ms(q(r.drvRunning, 50)), ms(q(r.coldRestore, 50)),
		ms(q(r.rawFrozen, 50)), ms(q(r.rawTotal, 50)), ms(q(r.rawRestore, 50)), ms(q(r.rawRestore, 99)), ms(q(r.rawRestoreExec, 50)),
		r.lazySummary(),
		ms(q(r.cold, 50)), ms(q(r.cold, 99)), ms(q(r.coldCreate, 50)),
		ratio(q(r.restoreExec, 50), q(r.cold, 50)), ratio(q(r.restore, 50), q(r.rawRestore, 50)),
		ratio(q(r.frozen, 50), q(r.rawFrozen, 50)))
	if r.fail != "" {
		s += "; FAILED: " + r.fail
	}
	return s
}

func (r *ckptBench) lazySummary() string {
	if len(r.lazy) == 0 {
		return "n/a (" + r.lazyNote + ")"
	}
	s := fmt.Sprintf("restore p50 %s p99 %s (+exec p50 %s)", ms(q(r.lazy, 50)), ms(q(r.lazy, 99)), ms(q(r.lazyExec, 50)))
	if r.lazyNote != "" {
		s += " " + r.lazyNote
	}
	return s
}

// markdownTable renders the results as the table in docs/benchmarks.md.
func markdownTable(rs []*ckptBench) string {
	var b strings.Builder
	fmt.Fprintf(&b, "driver %s\n\n", enginetest.DriverName())
	b.WriteString("| touched | image | stored 1st / incr. p50 | frozen 1st / incr. p50 | ckpt total 1st / incr. p50 | restore (hot) p50 / p99 | restore from chunk store p50 | restore+exec p50 / p99 | cold+setup p50 / p99 | restore+exec ÷ cold | driver-only frozen / restore p50 | Amber ÷ driver-only (frozen, restore) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.fail != "" && len(r.restore) == 0 {
			fmt.Fprintf(&b, "| %d MiB | failed: %s |||||||||\n", r.mib, r.fail)
			continue
		}
		fmt.Fprintf(&b, "| %d MiB | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s / %s | %s / %s | %s | %s / %s | %s, %s |\n",
			r.mib, mib(r.image), mib(r.stored1), mib(median(r.incStored)),
			ms(r.frozen1), ms(q(r.frozen, 50)), ms(r.total1), ms(q(r.total, 50)),
			ms(q(r.restore, 50)), ms(q(r.restore, 99)), ms(q(r.coldRestore, 50)), ms(q(r.restoreExec, 50)), ms(q(r.restoreExec, 99)),
			ms(q(r.cold, 50)), ms(q(r.cold, 99)), ratio(q(r.restoreExec, 50), q(r.cold, 50)),
			ms(q(r.rawFrozen, 50)), ms(q(r.rawRestore, 50)),
			ratio(q(r.frozen, 50), q(r.rawFrozen, 50)), ratio(q(r.restore, 50), q(r.rawRestore, 50)))
	}
	b.WriteString("\nlazy restore: ")
	for i, r := range rs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d MiB %s", r.mib, r.lazySummary())
	}
	b.WriteString("\n")
	return b.String()
}
