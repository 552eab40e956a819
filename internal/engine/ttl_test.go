package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// waitState waits up to d for sandbox id to be in state want and returns
// its row.
func waitState(t *testing.T, env *enginetest.Env, id string, want meta.State, d time.Duration) meta.Sandbox {
	t.Helper()
	until := time.Now().Add(d)
	for {
		cur, err := env.Meta.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State == want {
			return cur
		}
		if time.Now().After(until) {
			t.Fatalf("sandbox %s is %s (%s) after %v, want %s", id, cur.State, cur.Reason, d, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMetadataAndFilters: metadata given at create are on the row and
// select sandboxes in Find, with the state; bad metadata, timeouts and
// filters are InvalidArgument before anything is made.
func TestMetadataAndFilters(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Metadata: map[string]string{"team": "red", "run": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Metadata["team"] != "red" || a.Metadata["run"] != "1" || !a.Expires.IsZero() {
		t.Fatalf("created row: %+v", a)
	}
	b, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Metadata: map[string]string{"team": "blue"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Kill(ctx, "default", b.ID); err != nil {
		t.Fatal(err)
	}
	find := func(f engine.ListFilter) string {
		t.Helper()
		rows, err := e.Find(ctx, "default", f)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range rows {
			ids = append(ids, sb.ID)
		}
		return strings.Join(ids, ",")
	}
	for _, c := range []struct {
		f    engine.ListFilter
		want string
	}{
		{engine.ListFilter{}, a.ID + "," + b.ID},
		{engine.ListFilter{Metadata: map[string]string{"team": "red"}}, a.ID},
		{engine.ListFilter{Metadata: map[string]string{"team": "red", "run": "2"}}, ""},
		{engine.ListFilter{States: []meta.State{meta.StateRunning}}, a.ID},
		{engine.ListFilter{States: []meta.State{meta.StateStopped}, Metadata: map[string]string{"team": "blue"}}, b.ID},
		{engine.ListFilter{States: []meta.State{meta.StateStopped}, Metadata: map[string]string{"team": "red"}}, ""},
	} {
		if got := find(c.f); got != c.want {
			t.Errorf("find %+v: %q, want %q", c.f, got, c.want)
		}
	}
	if _, err := e.Find(ctx, "default", engine.ListFilter{States: []meta.State{"asleep"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("find by an unknown state: %v", err)
	}
	bad := []engine.CreateRequest{
		{Metadata: map[string]string{"": "x"}},
		{Metadata: map[string]string{"a=b": "x"}},
		{Metadata: map[string]string{"k": strings.Repeat("v", engine.MaxMetadataValue+1)}},
		{Metadata: map[string]string{"k": "a\x00b"}},
		{Timeout: -time.Second},
		{Timeout: engine.MaxTimeout + time.Second},
		{Timeout: time.Minute, OnTimeout: "explode"},
	}
	many := map[string]string{}
	for i := range engine.MaxMetadataPairs + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	bad = append(bad, engine.CreateRequest{Metadata: many})
	before, _ := env.Meta.List(ctx, meta.Filter{})
	for _, r := range bad {
		r.Tenant, r.Template = "default", "minimal"
		if _, err := e.Create(ctx, r); !errdefs.IsInvalidArgument(err) {
			t.Errorf("create with %+v: %v, want InvalidArgument", r, err)
		}
	}
	if after, _ := env.Meta.List(ctx, meta.Filter{}); len(after) != len(before) {
		t.Errorf("refused creates made rows: %d before, %d after", len(before), len(after))
	}
}

// TestTimeoutKillsSetTimeoutExtendsAndRestartKeeps: a sandbox created with
// a short timeout is killed at its deadline; SetTimeout moves another's
// deadline (it outlives its first one), the deadline is on the row across
// a restart, and the restarted engine kills it at that deadline.
func TestTimeoutKillsSetTimeoutExtendsAndRestartKeeps(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	short, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(short.Expires); d <= 0 || d > 2*time.Second {
		t.Fatalf("deadline of a 2s timeout is %v away", d)
	}
	gone, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Timeout: 2 * time.Second, OnTimeout: "destroy"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := kept.Expires
	if kept, err = env.Engine.SetTimeout(ctx, "default", kept.ID, 6*time.Second); err != nil {
		t.Fatal(err)
	}
	if !kept.Expires.After(first.Add(3 * time.Second)) {
		t.Fatalf("SetTimeout(6s) moved the deadline from %v to %v", first, kept.Expires)
	}

	killed := waitState(t, env, short.ID, meta.StateStopped, 30*time.Second)
	// The deadline is cleared just after the kill (expire): wait for it.
	for deadline := time.Now().Add(10 * time.Second); !killed.Expires.IsZero() && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if killed, err = env.Meta.Get(ctx, short.ID); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(killed.Reason, "timed out") || !killed.Expires.IsZero() {
		t.Fatalf("expired sandbox: reason %q, deadline %v", killed.Reason, killed.Expires)
	}
	if in, err := env.Driver.Inspect(ctx, short.ID); err == nil && in.State == sandbox.StateRunning {
		t.Fatalf("the driver still runs the expired sandbox: %+v", in)
	}
	if destroyed := waitState(t, env, gone.ID, meta.StateDestroyed, 30*time.Second); !strings.HasPrefix(destroyed.Reason, "timed out") {
		t.Fatalf("destroyed at its deadline, reason %q", destroyed.Reason)
	}
	if _, err := env.Engine.Exec(ctx, "default", short.ID, sandbox.ExecSpec{Args: []string{"true"}}); err == nil {
		t.Fatal("exec in a sandbox killed at its deadline succeeded (it was resumed)")
	}
	if time.Now().After(first) {
		if cur, _ := env.Meta.Get(ctx, kept.ID); cur.State != meta.StateRunning {
			t.Fatalf("the extended sandbox is %s past its first deadline", cur.State)
		}
	}

	env.Restart(t)
	cur, err := env.Meta.Get(ctx, kept.ID)
	if err != nil || !cur.Expires.Equal(kept.Expires) {
		t.Fatalf("deadline after a restart: %v (want %v) %v", cur.Expires, kept.Expires, err)
	}
	cur = waitState(t, env, kept.ID, meta.StateStopped, 30*time.Second)
	if time.Now().Before(kept.Expires) || !strings.HasPrefix(cur.Reason, "timed out") {
		t.Fatalf("restarted engine: %s (%s) at %v, deadline %v", cur.State, cur.Reason, time.Now(), kept.Expires)
	}
	if _, err := env.Engine.SetTimeout(ctx, "default", kept.ID, time.Minute); errdefs.HTTPStatus(err) != 412 {
		t.Fatalf("SetTimeout on a killed sandbox: %v", err)
	}
}

// TestTimeoutPausesAndResume: with OnTimeout pause the sandbox is
// checkpointed and stopped at its deadline; Resume brings it back with its
// processes' memory (the counter continues), and Pause does the same on
// request and clears the deadline.
func TestTimeoutPausesAndResume(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true, Timeout: 2 * time.Second, OnTimeout: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := e.StartProcess(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	before := lastLine(t, e, sb.ID, pid)
	paused := waitState(t, env, sb.ID, meta.StateStopped, time.Minute)
	if !engine.Paused(paused) || !paused.Expires.IsZero() {
		t.Fatalf("at its deadline: %q, deadline %v", paused.Reason, paused.Expires)
	}
	if sb, err = e.Resume(ctx, "default", sb.ID); err != nil || sb.State != meta.StateRunning {
		t.Fatalf("resume: %+v %v", sb, err)
	}
	after := lastLine(t, e, sb.ID, pid)
	if after.r != before.r || after.n < before.n {
		t.Fatalf("counter after resume %+v, before %+v: restarted, not resumed", after, before)
	}
	if _, err := e.SetTimeout(ctx, "default", sb.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pause(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	cur, _ := env.Meta.Get(ctx, sb.ID)
	if !engine.Paused(cur) || !cur.Expires.IsZero() {
		t.Fatalf("after Pause: %s %q deadline %v", cur.State, cur.Reason, cur.Expires)
	}
	if _, err := e.Resume(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if again := lastLine(t, e, sb.ID, pid); again.r != before.r || again.n < after.n {
		t.Fatalf("counter after the second resume %+v, before %+v", again, after)
	}
}
