package session

import (
	"context"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestEngineTenantCannotPlantSessionSandbox: a tenant that labels a
// sandbox of its own as its session's first one (amber.session=<id>,
// amber.session.sandbox=1, as a caller's create would ask the engine)
// hoping the session's Wake takes it for one an earlier attempt made, is
// refused (InvalidArgument) with nothing made; the Wake then makes and
// labels its own sandbox (the harness's create may set those labels). On
// main the plant was made, and the Wake ran the session's tools in it.
func TestEngineTenantCannotPlantSessionSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("real sandboxes")
	}
	for k := range sandboxLabels("s", 1) {
		if !engine.ReservedLabel(k) {
			t.Fatalf("session label %q is not reserved: a tenant could set it", k)
		}
	}
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	reg := eventlog.NewRegistry()
	RegisterEvents(reg)
	script := []ScriptTurn{{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"echo hi"}`)}}}, {Text: "done"}}
	h := &Harness{Log: env.Log, Registry: reg, Meta: env.Meta, Boxes: EngineSandboxes{E: env.Engine}, Logger: quiet(),
		Models: func(ModelConfig) (Model, error) { return NewScripted(script), nil }, Holder: "node/test"}
	s, err := NewManager(h).Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict})
	if err != nil {
		t.Fatal(err)
	}
	planted, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "acme", Template: "minimal", Metadata: sandboxLabels(s.ID, 1)})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("a tenant's create with its session's labels: %v (sandbox %q), want InvalidArgument", err, planted.ID)
	}
	if _, err := env.Log.Append(ctx, Stream(s.ID), 0, eventlog.Any, eventlog.Event{Tenant: "acme", ID: s.ID + ".in.1", Type: EventUserMessage, Version: 1, Payload: mustJSON(UserMessage{Text: "go"})}); err != nil {
		t.Fatal(err)
	}
	if st, err := h.Wake(ctx, s.ID); err != nil || st != StatusIdle {
		t.Fatalf("wake: %v %v", st, err)
	}
	sbs, err := env.Engine.Find(ctx, "acme", engine.ListFilter{Metadata: sandboxLabels(s.ID, 1)})
	if err != nil || len(sbs) != 1 {
		t.Fatalf("the session's labeled sandboxes: %d %v, want its own one", len(sbs), err)
	}
	if planted.ID != "" && sbs[0].ID == planted.ID {
		t.Fatalf("the session's Wake took the tenant's planted sandbox %s as its own", planted.ID)
	}
}
