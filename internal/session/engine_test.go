package session

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/lib/failpoint"
)

func TestMain(m *testing.M) { enginetest.Main(m) }

// TestEngineStrictCutOffToolRestoresSandbox runs a strict session in a real
// sandbox. A bash call appends a line to a file in the sandbox; the harness
// is killed after the tool ran and its checkpoint was cut, before its result
// was recorded. The next harness restores the sandbox to the checkpoint of
// the last acknowledged step and runs the call again: the file has the line
// once, as after an uninterrupted run, and the acknowledged call before it
// did not run again.
func TestEngineStrictCutOffToolRestoresSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("real sandboxes")
	}
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	reg := eventlog.NewRegistry()
	RegisterEvents(reg)
	script := []ScriptTurn{
		{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"echo first >> /tmp/log.txt; wc -l < /tmp/log.txt"}`)}}},
		{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"echo second >> /tmp/log.txt; cat /tmp/log.txt"}`)}}},
		{ToolCalls: []ScriptToolCall{{Name: "read_file", Input: in(`{"path":"/tmp/log.txt"}`)}}},
		{Text: "done"},
	}
	model := NewScripted(script)
	h := func(fp *failpoint.Set) *Harness {
		return &Harness{Log: env.Log, Registry: reg, Meta: env.Meta, Boxes: EngineSandboxes{E: env.Engine}, Logger: quiet(),
			Models: func(ModelConfig) (Model, error) { return model, nil }, Holder: "node/test", Failpoints: fp}
	}
	s, err := NewManager(h(nil)).Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict})
	if err != nil {
		t.Fatal(err)
	}
	id := s.ID
	if _, err := env.Log.Append(ctx, Stream(id), 0, eventlog.Any, eventlog.Event{Tenant: "acme", ID: id + ".in.1", Type: EventUserMessage, Version: 1, Payload: mustJSON(UserMessage{Text: "go"})}); err != nil {
		t.Fatal(err)
	}
	fp := failpoint.New()
	fp.Arm(FPToolBeforeRecord, 2, failpoint.ErrCrash)
	if _, err := h(fp).Wake(ctx, id); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("first harness: %v", err)
	}
	st, err := h(nil).Wake(ctx, id)
	if err != nil || st != StatusIdle {
		t.Fatalf("woken: %v %v", st, err)
	}
	evs, err := env.Log.Read(ctx, Stream(id), 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	fold := NewState(id)
	restores := 0
	for _, ev := range evs {
		if err := fold.Apply(ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type == EventSandboxRestored {
			restores++
		}
	}
	var results []ToolResult
	for _, c := range []string{"call_1_1", "call_2_1", "call_3_1"} {
		results = append(results, fold.Results[c])
	}
	if results[0].Output != "exit 0\n1\n" || results[1].Output != "exit 0\nfirst\nsecond\n" || results[2].Output != "first\nsecond\n" {
		t.Fatalf("results %+v", results)
	}
	if results[0].Checkpoint == "" || results[1].Checkpoint == "" || results[0].Checkpoint == results[1].Checkpoint {
		t.Fatalf("strict results without their own checkpoints: %+v", results)
	}
	if restores != 1 {
		t.Fatalf("%d restores, want 1", restores)
	}
	if fold.ToolAttempts["call_1_1"] != 1 || fold.ToolAttempts["call_2_1"] != 2 {
		t.Fatalf("attempts %v: the acknowledged call must run once, the cut-off one twice", fold.ToolAttempts)
	}
}

// TestEngineFastLostSandboxReruns: a fast session in a real sandbox,
// checkpointed every two changing steps. The harness dies after the third
// step was recorded (not covered by a checkpoint) and the sandbox is killed.
// The next harness restores the checkpoint, re-runs the third step (same
// output: no divergence) and goes on: the file has each line once.
func TestEngineFastLostSandboxReruns(t *testing.T) {
	if testing.Short() {
		t.Skip("real sandboxes")
	}
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	reg := eventlog.NewRegistry()
	RegisterEvents(reg)
	step := ScriptTurn{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"echo a >> /tmp/f; wc -l < /tmp/f"}`)}}}
	script := []ScriptTurn{step, step, step, {ToolCalls: []ScriptToolCall{{Name: "read_file", Input: in(`{"path":"/tmp/f"}`)}}}, {Text: "done"}}
	model := NewScripted(script)
	h := func(fp *failpoint.Set) *Harness {
		return &Harness{Log: env.Log, Registry: reg, Meta: env.Meta, Boxes: EngineSandboxes{E: env.Engine}, Logger: quiet(),
			Models: func(ModelConfig) (Model, error) { return model, nil }, Holder: "node/test", Failpoints: fp}
	}
	s, err := NewManager(h(nil)).Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyFast, FastEvery: 2})
	if err != nil {
		t.Fatal(err)
	}
	id := s.ID
	if _, err := env.Log.Append(ctx, Stream(id), 0, eventlog.Any, eventlog.Event{Tenant: "acme", ID: id + ".in.1", Type: EventUserMessage, Version: 1, Payload: mustJSON(UserMessage{Text: "go"})}); err != nil {
		t.Fatal(err)
	}
	fp := failpoint.New()
	fp.Arm(FPModelAfterRecord, 4, failpoint.ErrCrash)
	if _, err := h(fp).Wake(ctx, id); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("first harness: %v", err)
	}
	fold := func() *State {
		evs, err := env.Log.Read(ctx, Stream(id), 1, 1000)
		if err != nil {
			t.Fatal(err)
		}
		st := NewState(id)
		for _, ev := range evs {
			if err := st.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	st := fold()
	if st.Cut.Checkpoint == "" || st.ChangedSinceCut != 1 {
		t.Fatalf("before the loss: cut %+v, %d changing steps after it (want a checkpoint and 1)", st.Cut, st.ChangedSinceCut)
	}
	if _, err := env.Engine.Kill(ctx, "acme", st.Sandbox); err != nil {
		t.Fatal(err)
	}
	if got, err := h(nil).Wake(ctx, id); err != nil || got != StatusIdle {
		t.Fatalf("woken: %v %v", got, err)
	}
	st = fold()
	want := map[string]string{"call_1_1": "exit 0\n1\n", "call_2_1": "exit 0\n2\n", "call_3_1": "exit 0\n3\n", "call_4_1": "a\na\na\n"}
	for c, w := range want {
		if st.Results[c].Output != w {
			t.Fatalf("%s: %q, want %q", c, st.Results[c].Output, w)
		}
	}
	evs, _ := env.Log.Read(ctx, Stream(id), 1, 1000)
	var restored []SandboxRestored
	for _, ev := range evs {
		switch ev.Type {
		case EventDivergence:
			t.Fatalf("divergence: %s", ev.Payload)
		case EventSandboxRestored:
			var r SandboxRestored
			json.Unmarshal(ev.Payload, &r)
			restored = append(restored, r)
		}
	}
	if len(restored) != 1 || restored[0].Checkpoint == "" || len(restored[0].Rerun) != 1 || restored[0].Rerun[0] != "call_3_1" {
		t.Fatalf("restores %+v", restored)
	}
}

// TestEngineSandboxRecordFailsOneSandbox: in real sandboxes, the append
// naming the session's new sandbox fails (the log full, twice) and the
// Manager's retried Wakes go on with the sandbox the first one made; then
// the daemon dies between making a session's sandbox and naming it, and
// the restarted daemon's Wake takes that one. Each time the engine's list
// holds exactly one sandbox of the session when it is done — on main
// every failed attempt left one running.
func TestEngineSandboxRecordFailsOneSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("real sandboxes")
	}
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	reg := eventlog.NewRegistry()
	RegisterEvents(reg)
	script := []ScriptTurn{
		{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"echo a >> /tmp/f; wc -l < /tmp/f"}`)}}},
		{Text: "done"},
	}
	h := func(fp *failpoint.Set) *Harness {
		model := NewScripted(script)
		return &Harness{Log: env.Log, Registry: reg, Meta: env.Meta, Boxes: EngineSandboxes{E: env.Engine}, Logger: quiet(),
			Models: func(ModelConfig) (Model, error) { return model, nil }, Holder: "node/test", Failpoints: fp}
	}
	def := Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict}
	fold := func(id string) *State {
		evs, err := env.Log.Read(ctx, Stream(id), 1, 1000)
		if err != nil {
			t.Fatal(err)
		}
		st := NewState(id)
		for _, ev := range evs {
			if err := st.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	check := func(id string) {
		t.Helper()
		st := fold(id)
		if st.Status != StatusIdle || st.Results["call_1_1"].Output != "exit 0\n1\n" {
			t.Fatalf("session %s: %s, result %+v", id, st.Status, st.Results["call_1_1"])
		}
		sbs, err := env.Engine.Find(ctx, "acme", engine.ListFilter{Metadata: map[string]string{LabelSession: id}})
		if err != nil {
			t.Fatal(err)
		}
		all, err := env.Engine.List(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if len(sbs) != 1 || sbs[0].ID != st.Sandbox || len(all) != 1 {
			t.Fatalf("session %s's sandboxes %+v, the tenant's %d (the log names %s): want exactly the one it names", id, sbs, len(all), st.Sandbox)
		}
	}

	// The record fails; the Manager retries.
	hr := h(nil)
	fl := failAppends(env.Log, EventSandboxCreated, 2)
	hr.Log = fl
	m := NewManager(hr)
	m.backoff = 10 * time.Millisecond
	s, err := m.Create(ctx, "acme", def)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Post(ctx, "acme", s.ID, EventUserMessage, json.RawMessage(`{"text":"go"}`), "go"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for st := fold(s.ID); st.Status != StatusIdle || st.Calls < 2; st = fold(s.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the session did not finish within 2 minutes (status %s)", st.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.Close()
	if fl.fails.Load() != 2 {
		t.Fatalf("%d sandbox_created appends failed, want 2", fl.fails.Load())
	}
	check(s.ID)
	if err := env.Engine.Destroy(ctx, "acme", fold(s.ID).Sandbox); err != nil {
		t.Fatal(err)
	}

	// The daemon dies between the create and the record.
	s, err = NewManager(h(nil)).Create(ctx, "acme", def)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Log.Append(ctx, Stream(s.ID), 0, eventlog.Any, eventlog.Event{Tenant: "acme", ID: s.ID + ".in.1", Type: EventUserMessage, Version: 1, Payload: mustJSON(UserMessage{Text: "go"})}); err != nil {
		t.Fatal(err)
	}
	fp := failpoint.New()
	fp.Arm(FPSandboxBeforeRecord, 1, failpoint.ErrCrash)
	if _, err := h(fp).Wake(ctx, s.ID); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("first daemon: %v, want the crash", err)
	}
	env.Restart(t)
	if st, err := h(nil).Wake(ctx, s.ID); err != nil || st != StatusIdle {
		t.Fatalf("restarted daemon: %v %v", st, err)
	}
	check(s.ID)
}
