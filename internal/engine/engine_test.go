package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
	"github.com/amber-run/amber/stores/sqlmeta"
)

func TestMain(m *testing.M) { enginetest.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func execOut(t *testing.T, e *engine.Engine, tenant, id string, args ...string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := e.Exec(ctxT(t), tenant, id, sandbox.ExecSpec{Args: args, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return out.String(), st.Code
}

func eventTypes(t *testing.T, e *engine.Engine, tenant, id string) []string {
	t.Helper()
	evs, err := e.Events(ctxT(t), tenant, id, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

func TestLifecycleAndEvents(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	e, ctx := env.Engine, ctxT(t)
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Env: []string{"GREETING=hi"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != meta.StateRunning || sb.FromPool || sb.Tenant != "default" {
		t.Fatalf("created: %+v", sb)
	}
	if out, code := execOut(t, e, "default", sb.ID, "sh", "-c", "echo $GREETING; exit 3"); out != "hi\n" || code != 3 {
		t.Fatalf("exec: %q %d", out, code)
	}
	// Another tenant sees nothing.
	if _, err := e.Get(ctx, "other", sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant get: %v", err)
	}
	if _, err := e.Exec(ctx, "other", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant exec: %v", err)
	}
	// A background process: its owner waits for its status; another
	// tenant cannot even learn that it exists.
	pid, err := e.StartProcess(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Wait(ctx, "other", sb.ID, pid); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant wait: %v", err)
	}
	if st, err := e.Wait(ctx, "default", sb.ID, pid); err != nil || st != (sandbox.ExitStatus{Code: 4}) {
		t.Fatalf("wait: %+v %v, want exit 4", st, err)
	}
	if _, err := e.Wait(ctx, "default", sb.ID, 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("wait for pid 0: %v", err)
	}
	if _, err := e.Kill(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Wait(ctx, "default", sb.ID, pid); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("wait in killed sandbox: %v", err)
	}
	_, err = e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec in killed sandbox: %v", err)
	}
	if err := e.Destroy(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(ctx, "default", sb.ID); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if l, _ := e.List(ctx, "default"); len(l) != 0 {
		t.Fatalf("listed after destroy: %+v", l)
	}
	got := strings.Join(eventTypes(t, e, "default", sb.ID), ",")
	if got != "sandbox.created,sandbox.started,sandbox.killed,sandbox.destroyed" {
		t.Fatalf("events: %s", got)
	}
	if infos, _ := env.Driver.List(ctx); len(infos) != 0 {
		t.Fatalf("driver still has %+v", infos)
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	for _, r := range []engine.CreateRequest{
		{Tenant: "default", Template: "nope"},
		{Tenant: "default", Template: "minimal", Limits: sandbox.Limits{MemoryBytes: 1}},
		{Tenant: "default", Template: "minimal", Env: []string{"NOEQUALS"}},
		{Template: "minimal"},
	} {
		if _, err := env.Engine.Create(ctx, r); err == nil || errdefs.HTTPStatus(err) >= 500 {
			t.Errorf("create %+v: %v", r, err)
		}
	}
}

func waitPool(t *testing.T, e *engine.Engine, template string, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, ready := e.PoolSize(template); ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pool of %s never reached %d", template, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWarmPoolClaim(t *testing.T) {
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	e, ctx := env.Engine, ctxT(t)
	waitPool(t, e, "minimal", 1)
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Env: []string{"WHO=claimer"}})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool || sb.Pooled {
		t.Fatalf("not claimed from the pool: %+v", sb)
	}
	if out, _ := execOut(t, e, "default", sb.ID, "sh", "-c", "echo $WHO"); out != "claimer\n" {
		t.Fatalf("claimed env: %q", out)
	}
	var p engine.CreatedPayload
	evs, _ := e.Events(ctx, "default", sb.ID, 1, 10)
	if len(evs) != 2 || json.Unmarshal(evs[0].Payload, &p) != nil || !p.FromPool {
		t.Fatalf("claim events: %+v", evs)
	}
	// The pool refills; different limits are served cold unless the driver
	// can change them.
	waitPool(t, e, "minimal", 1)
	other, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Limits: sandbox.Limits{MemoryBytes: 100 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if _, canUpdate := env.Driver.(engine.LimitUpdater); other.FromPool != canUpdate || other.Limits.MemoryBytes != 100<<20 {
		t.Fatalf("create with other limits: %+v", other)
	}
	// A claimed sandbox never goes back: destroying it leaves the pool alone.
	if err := e.Destroy(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, ready := e.PoolSize("minimal"); ready != 1 {
		t.Fatalf("pool has %d ready", ready)
	}
	// Shutdown drains the pool.
	env.Close(t)
	pooled := true
	m, _ := sqlmeta.Open(env.Dir+"/meta.db", sqlmeta.Options{})
	defer m.Close()
	if rows, _ := m.List(ctx, meta.Filter{Pooled: &pooled}); len(rows) != 0 {
		t.Fatalf("pooled sandboxes left after Close: %+v", rows)
	}
}

// TestWarmPoolPaused: a paused pool (its node is draining) destroys its
// ready sandboxes, creates none and hands none out (a create is cold);
// resumed, it refills.
func TestWarmPoolPaused(t *testing.T) {
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	e, ctx := env.Engine, ctxT(t)
	waitPool(t, e, "minimal", 1)
	pooled := true
	rows, err := env.Meta.List(ctx, meta.Filter{Pooled: &pooled})
	if err != nil || len(rows) != 1 {
		t.Fatalf("pooled rows: %+v %v", rows, err)
	}
	if err := e.PausePool(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, ready := e.PoolSize("minimal"); ready != 0 {
		t.Fatalf("paused pool has %d ready", ready)
	}
	if left, _ := env.Meta.List(ctx, meta.Filter{Pooled: &pooled}); len(left) != 0 {
		t.Fatalf("pooled sandboxes left after the pause: %+v", left)
	}
	if in, err := env.Driver.Inspect(ctx, rows[0].ID); err == nil && in.State == sandbox.StateRunning {
		t.Fatalf("the pooled sandbox still runs after the pause: %+v", in)
	}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil || sb.FromPool {
		t.Fatalf("create while paused: %+v %v (want a cold create)", sb, err)
	}
	time.Sleep(2 * time.Second)
	if _, ready := e.PoolSize("minimal"); ready != 0 {
		t.Fatalf("paused pool refilled: %d ready", ready)
	}
	if err := e.PausePool(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitPool(t, e, "minimal", 1)
}

// TestRestartReconciles: a sandbox that still runs is reattached; one that
// died while the daemon was down is marked crashed, with an event.
func TestRestartReconciles(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	alive, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	env.Close(t)
	if err := env.Driver.Kill(ctx, lost.ID); err != nil { // behind the daemon's back
		t.Fatal(err)
	}
	env.Restart(t)
	e := env.Engine
	if out, _ := execOut(t, e, "default", alive.ID, "echo", "back"); out != "back\n" {
		t.Fatalf("reattached exec: %q", out)
	}
	got, err := e.Get(ctx, "default", lost.ID)
	if err != nil || got.State != meta.StateCrashed || got.Reason == "" {
		t.Fatalf("lost sandbox: %+v %v", got, err)
	}
	types := eventTypes(t, e, "default", lost.ID)
	if types[len(types)-1] != engine.EventCrashed {
		t.Fatalf("lost sandbox events: %v", types)
	}
	if got := eventTypes(t, e, "default", alive.ID); len(got) != 2 {
		t.Fatalf("alive sandbox events: %v", got)
	}
}

// TestWatchNoticesDeadInit: a sandbox killed behind the engine's back while
// it runs is marked crashed with sandbox.exited.
func TestWatchNoticesDeadInit(t *testing.T) {
	env := enginetest.New(t, engine.Options{WatchInterval: 100 * time.Millisecond})
	e, ctx := env.Engine, ctxT(t)
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Driver.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _ := e.Get(ctx, "default", sb.ID)
		types := eventTypes(t, e, "default", sb.ID)
		if got.State == meta.StateCrashed && types[len(types)-1] == engine.EventExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never marked crashed: %+v, events %v", got, types)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClaimWaitsForPoolFill: a create that arrives while the pool's first
// sandbox is being made gets that sandbox instead of a parallel cold one.
func TestClaimWaitsForPoolFill(t *testing.T) {
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	e, ctx := env.Engine, ctxT(t)
	// Right after Start the pool's create is (almost certainly) in flight.
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool {
		t.Fatalf("create during the first fill was cold: %+v", sb)
	}
}

// TestStartRetriesTransientStoreErrors: a daemon whose metadata store
// fails reads at start (a database restarting, one read answered with an
// error: what stopped `amber up` in a chaos run) keeps trying its start-up
// reconciles with backoff and comes up once the store answers, its
// sandbox reconciled, instead of exiting.
func TestStartRetriesTransientStoreErrors(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	fps := failpoint.New()
	transient := errors.New("injected: connection reset by peer")
	fails := 0
	fps.ArmEach("meta.read", 1, func(string) error {
		if fails < 3 { // the first three reads of the new daemon fail
			fails++
			return transient
		}
		return nil
	})
	env.MetaFailpoints = fps
	start := time.Now()
	env.Restart(t) // t.Fatal if Start returns an error
	if fails != 3 {
		t.Fatalf("the store failed %d reads at start, want 3 (the failpoint is not on the start path?)", fails)
	}
	t.Logf("started after %d failed reads in %v", fails, time.Since(start).Round(time.Millisecond))
	got, err := env.Engine.Get(ctx, "default", sb.ID)
	if err != nil || got.State != meta.StateRunning {
		t.Fatalf("after the start: %+v %v, want the sandbox running", got, err)
	}
	var out strings.Builder
	if st, err := env.Engine.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"echo", "ok"}, Stdout: &out}); err != nil || st.Code != 0 || strings.TrimSpace(out.String()) != "ok" {
		t.Fatalf("exec after the start: %v %+v %q", err, st, out.String())
	}
}
