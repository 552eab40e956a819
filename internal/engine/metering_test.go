package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestMeteringKillRestoreRestart meters a sandbox that runs a CPU burner
// through a restore in place (its running incarnation killed mid-interval,
// a new cgroup counting from zero) and a daemon restart mid-interval, and
// checks the usage records against the driver's own counters read by the
// test: the CPU-seconds recorded are at least what the two incarnations'
// counters said just before each was killed (nothing lost: not the old
// incarnation's last partial interval, not the time the daemon was down)
// and at most 5 % more (nothing counted twice: a restarted daemon that
// lost its baseline would count the whole counter again), every
// (meter, interval) is recorded once, and the checkpoint and the restore
// are counted once each.
func TestMeteringKillRestoreRestart(t *testing.T) {
	const every = time.Second
	env := enginetest.New(t, engine.Options{MeterInterval: every})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tenant = "default"
	ur, ok := env.Driver.(sandbox.UsageReporter)
	if !ok {
		t.Fatalf("driver %s has no UsageReporter", env.Driver.Name())
	}
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true,
		Limits: sandbox.Limits{MilliCPUs: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	// The cut has no burner: the restored incarnation starts one itself.
	ck, err := env.Engine.Checkpoint(ctx, engine.CheckpointRequest{Tenant: tenant, Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	burn := func() int {
		pid, err := env.Engine.StartProcess(ctx, tenant, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "while :; do :; done"}})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	// stopBurner kills the burner and returns the driver's counter once
	// the sandbox is quiet.
	stopBurner := func(pid int) uint64 {
		if err := env.Engine.Signal(ctx, tenant, id, pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		u, err := ur.Usage(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return u.CPUNanos
	}
	midInterval := func() { // sleep until 0.4 s into an interval
		now := time.Now()
		next := now.Truncate(every).Add(every + 400*time.Millisecond)
		time.Sleep(next.Sub(now))
	}

	pid := burn()
	time.Sleep(2 * every)
	midInterval()
	gen0 := stopBurner(pid)
	if _, err := env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: tenant, Checkpoint: ck.ID}); err != nil {
		t.Fatal(err)
	}
	pid = burn()
	time.Sleep(2 * every)
	midInterval()
	before := time.Now()
	env.Restart(t)
	t.Logf("daemon restarted in %v", time.Since(before).Round(time.Millisecond))
	time.Sleep(2 * every)
	midInterval()
	gen1 := stopBurner(pid)
	if _, err := env.Engine.Kill(ctx, tenant, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(every + 500*time.Millisecond) // the last record
	env.Close(t)
	env.Restart(t) // reopen the stores to read them
	recs, err := env.Engine.UsageRecords(ctx, tenant, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}

	var cpu float64
	counts := map[string]float64{}
	seen := map[string]bool{}
	var starts []time.Time
	for _, r := range recs {
		if r.Sandbox != id {
			continue
		}
		k := r.Meter + "@" + r.Start.Format(time.RFC3339Nano)
		if seen[k] {
			t.Errorf("%s recorded twice", k)
		}
		seen[k] = true
		counts[r.Meter] += r.Quantity
		if r.Meter == engine.MeterCPUSeconds {
			cpu += r.Quantity
			starts = append(starts, r.Start)
			if r.Quantity < 0 {
				t.Errorf("negative cpu record %+v", r)
			}
		}
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	want := float64(gen0+gen1) / 1e9
	t.Logf("cpu: recorded %.3f s in %d records; the incarnations' counters before their kills: %.3f + %.3f = %.3f s; meters %v",
		cpu, len(starts), float64(gen0)/1e9, float64(gen1)/1e9, want, counts)
	if want < 2 {
		t.Fatalf("the burners used only %.3f CPU-seconds: nothing to measure", want)
	}
	if cpu < want-0.001 {
		t.Errorf("recorded %.3f CPU-seconds, less than the %.3f the counters showed: usage lost", cpu, want)
	}
	if cpu > want*1.05 {
		t.Errorf("recorded %.3f CPU-seconds, more than 5 %% over the %.3f the counters showed: usage counted twice", cpu, want)
	}
	if counts[engine.MeterCheckpoints] != 1 || counts[engine.MeterRestores] != 1 {
		t.Errorf("checkpoints %v, restores %v: want 1 each", counts[engine.MeterCheckpoints], counts[engine.MeterRestores])
	}
	if counts[engine.MeterMemoryGiBSeconds] <= 0 {
		t.Errorf("no memory recorded")
	}
	// A running sandbox has a cpu record every interval; the gaps are the
	// intervals in which it could not be sampled (the checkpoint's freeze,
	// the restore, the daemon's restart), none long. The sums above are
	// what proves nothing was lost across them.
	gaps := 0
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d != every {
			gaps++
			if d > 10*every {
				t.Errorf("no cpu record between %v and %v", starts[i-1], starts[i])
			}
		}
	}
	t.Logf("%d gaps in %d cpu records", gaps, len(starts))
	if s := storageRecorded(recs); s <= 0 || math.IsNaN(s) {
		t.Errorf("checkpoint storage not recorded: %v", s)
	}
}

func storageRecorded(recs []engine.UsageRecord) float64 {
	var s float64
	for _, r := range recs {
		if r.Meter == engine.MeterStorageGiBHours {
			s += r.Quantity
		}
	}
	return s
}

// TestMeteringRetryIsIdempotent drives the metering loop by hand: a batch
// whose append committed but whose answer was lost is sent again at the
// next interval and changes nothing; a repeated interval builds nothing; a
// record whose id exists with other content is dropped while the rest of
// its batch lands; and the CPU recorded equals the driver's counter.
func TestMeteringRetryIsIdempotent(t *testing.T) {
	env := enginetest.New(t, engine.Options{MeterInterval: 24 * time.Hour}) // the loop stays idle
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tenant = "default"
	e := env.Engine
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	stream := engine.UsageStream(tenant)
	head := func() uint64 {
		b, err := env.Log.Bounds(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		return b.Head
	}
	end1 := time.Now()
	if err := e.MeterTick(ctx, end1); err != nil {
		t.Fatal(err)
	}
	first, err := env.Log.Read(ctx, stream, 1, 100)
	if err != nil || len(first) < 2 {
		t.Fatalf("first interval: %d events, %v", len(first), err)
	}
	// The answer was lost: the same batch goes again, first, at the next tick.
	e.SetUnsentUsage(tenant, first)
	if _, err := e.Exec(ctx, tenant, sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"}}); err != nil {
		t.Fatal(err)
	}
	h1 := head()
	end2 := end1.Add(time.Second)
	if err := e.MeterTick(ctx, end2); err != nil {
		t.Fatal(err)
	}
	h2 := head()
	if err := e.MeterTick(ctx, end2); err != nil { // repeated: nothing built
		t.Fatal(err)
	}
	if head() != h2 {
		t.Errorf("a repeated interval appended %d events", head()-h2)
	}
	// A conflicting record (same id, other content) is dropped; its
	// batch's other records land.
	evs, _ := env.Log.Read(ctx, stream, h1+1, 100)
	bad := evs[0]
	bad.Payload = []byte(`{"sandbox":"x","meter":"cpu_seconds","quantity":1000}`)
	e.SetUnsentUsage(tenant, []eventlog.Event{bad})
	end3 := end2.Add(time.Second)
	if err := e.MeterTick(ctx, end3); err != nil {
		t.Fatalf("a conflicting old record blocked the interval: %v", err)
	}
	u, err := env.Driver.(sandbox.UsageReporter).Usage(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := e.UsageRecords(ctx, tenant, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var cpu float64
	var n int
	for _, r := range recs {
		if r.Sandbox == sb.ID && r.Meter == engine.MeterCPUSeconds {
			cpu += r.Quantity
			n++
		}
		if r.Quantity >= 1000 {
			t.Errorf("the conflicting record landed: %+v", r)
		}
	}
	t.Logf("%d cpu records, %.4f s; the driver's counter now %.4f s", n, cpu, float64(u.CPUNanos)/1e9)
	if n != 3 {
		t.Errorf("%d cpu records for 3 intervals (one resent), want 3", n)
	}
	if want := float64(u.CPUNanos) / 1e9; cpu > want+1e-6 || cpu < want*0.9 { // 1e-6: float sums of ns
		t.Errorf("recorded %.4f CPU-seconds; the counter says %.4f", cpu, want)
	}
}

// TestMeteringMemory holds a known amount of memory (48 MiB in the
// sandbox's /dev/shm) for a known time and checks memory_gib_seconds over
// whole intervals: at least 48 MiB × the time, and within ±5 % of the
// test's own integral of the driver's memory readings (every 100 ms).
func TestMeteringMemory(t *testing.T) {
	const every = time.Second
	env := enginetest.New(t, engine.Options{MeterInterval: every})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tenant = "default"
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if out, code := execOut(t, env.Engine, tenant, sb.ID, "sh", "-c", "mkdir -p /dev/shm && dd if=/dev/zero of=/dev/shm/fill bs=1M count=48 2>&1"); code != 0 {
		t.Fatalf("fill: %s", out)
	}
	ur := env.Driver.(sandbox.UsageReporter)
	// Integrate from one boundary to the one 4 intervals later.
	now := time.Now()
	w0 := now.Truncate(every).Add(every)
	w1 := w0.Add(4 * every)
	time.Sleep(time.Until(w0))
	var integral float64 // GiB-seconds
	prev := time.Now()
	for time.Now().Before(w1) {
		time.Sleep(100 * time.Millisecond)
		u, err := ur.Usage(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		integral += float64(u.MemoryBytes) / (1 << 30) * at.Sub(prev).Seconds()
		prev = at
	}
	time.Sleep(every / 2) // the record closing w1
	// The record starting at s covers (s, s+every]: the window is the
	// records starting in [w0, w1).
	recs, err := env.Engine.UsageRecords(ctx, tenant, w0, w1)
	if err != nil {
		t.Fatal(err)
	}
	var mem float64
	var n int
	for _, r := range recs {
		if r.Sandbox == sb.ID && r.Meter == engine.MeterMemoryGiBSeconds {
			mem += r.Quantity
			n++
		}
	}
	floor := 48.0 / 1024 * w1.Sub(w0).Seconds()
	t.Logf("memory over %v: recorded %.4f GiB-s in %d records; the test's integral %.4f GiB-s; 48 MiB alone %.4f", w1.Sub(w0), mem, n, integral, floor)
	if n != 4 {
		t.Fatalf("%d memory records in 4 intervals", n)
	}
	if mem < floor {
		t.Errorf("recorded %.4f GiB-s, less than the 48 MiB held: %.4f", mem, floor)
	}
	if d := (mem - integral) / integral; d > 0.05 || d < -0.05 {
		t.Errorf("recorded %.4f GiB-s is %.1f %% off the test's %.4f", mem, 100*d, integral)
	}
}

// TestMeteringCountsSurviveCrash: checkpoints, a restore and journaled
// egress that happen in an interval the daemon dies in (the engine is
// closed without closing the interval, which is what a crash does to the
// metering's memory) are counted at the next interval of the new daemon,
// once — from the sandbox's stream and effect journal behind the cursors
// of the last record, not from memory. A further interval counts nothing
// again.
func TestMeteringCountsSurviveCrash(t *testing.T) {
	env := enginetest.New(t, engine.Options{MeterInterval: 24 * time.Hour}) // the loop stays idle
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tenant = "default"
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	tick := func() {
		t.Helper()
		end = end.Add(time.Second)
		if err := env.Engine.MeterTick(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	tick() // the first record: its cursors say where counting goes on
	var ck string
	for range 2 {
		c, err := env.Engine.Checkpoint(ctx, engine.CheckpointRequest{Tenant: tenant, Sandbox: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		ck = c.ID
	}
	if _, err := env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: tenant, Checkpoint: ck}); err != nil {
		t.Fatal(err)
	}
	// Two forwards in the effect journal (what the gateway writes), with
	// their bytes, and an intent without outcome (not a forward yet).
	lease, err := env.Log.Acquire(ctx, gateway.Stream(sb.ID), "test", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var evs []eventlog.Event
	for i, p := range []any{
		gateway.OutcomePayload{Key: "k1", Status: 200, RequestBytes: 100, ResponseBytes: 1000},
		gateway.IntentPayload{Key: "k2"},
		gateway.OutcomePayload{Key: "k2", Status: 502, Error: "upstream: refused", RequestBytes: 7},
		gateway.IntentPayload{Key: "k3"},
	} {
		typ := gateway.EventOutcome
		if _, ok := p.(gateway.IntentPayload); ok {
			typ = gateway.EventIntent
		}
		b, _ := json.Marshal(p)
		evs = append(evs, eventlog.Event{Tenant: tenant, ID: fmt.Sprintf("test-effect-%d", i), Type: typ, Version: 1, Payload: b})
	}
	if _, err := env.Log.Append(ctx, gateway.Stream(sb.ID), lease.Epoch, eventlog.Any, evs...); err != nil {
		t.Fatal(err)
	}
	env.Restart(t) // the interval's counts die with the old daemon's memory
	tick()
	tick()
	recs, err := env.Engine.UsageRecords(ctx, tenant, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, r := range recs {
		if r.Sandbox == sb.ID {
			got[r.Meter] += r.Quantity
		}
	}
	t.Logf("recorded: %v", got)
	for meter, want := range map[string]float64{engine.MeterCheckpoints: 2, engine.MeterRestores: 1,
		engine.MeterEgressRequests: 2, engine.MeterEgressBytes: 1107} {
		if got[meter] != want {
			t.Errorf("%s: recorded %v, want %v", meter, got[meter], want)
		}
	}
}
