package session

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlite"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestModelUsageFromLogs: model tokens are summed from the recorded model
// answers of the tenant's sessions only, within the time range.
func TestModelUsageFromLogs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, err := sqlmeta.Open(filepath.Join(dir, "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	log, err := sqlite.Open(filepath.Join(dir, "log.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	for _, tn := range []string{"acme", "globex"} {
		if _, err := m.CreateTenant(ctx, meta.Tenant{ID: tn}); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(tenant, session string, call, in, out int) {
		b, _ := json.Marshal(ModelRequestEnded{Call: call, Attempt: 1, Usage: Usage{InputTokens: in, OutputTokens: out}})
		if _, err := log.Append(ctx, Stream(session), 0, eventlog.Any, eventlog.Event{Tenant: tenant, ID: session + "." + string(rune('a'+call)), Type: EventModelRequestEnded, Version: 1, Payload: b}); err != nil {
			t.Fatal(err)
		}
	}
	for _, se := range []meta.Session{{ID: "ses-a", Tenant: "acme"}, {ID: "ses-b", Tenant: "globex"}} {
		se.Definition, se.Status = `{}`, "idle"
		if _, err := m.InsertSession(ctx, se); err != nil {
			t.Fatal(err)
		}
	}
	answer("acme", "ses-a", 0, 100, 20)
	answer("acme", "ses-a", 1, 300, 5)
	answer("globex", "ses-b", 0, 7000, 7000)
	recs, err := ModelUsage(log, m)(ctx, "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]float64{}
	for _, r := range recs {
		if r.Sandbox != "ses-a" {
			t.Fatalf("a record of %s in acme's usage", r.Sandbox)
		}
		sum[r.Meter] += r.Quantity
	}
	if sum[engine.MeterModelInputTokens] != 400 || sum[engine.MeterModelOutputTokens] != 25 {
		t.Fatalf("acme's tokens %v, want 400 in / 25 out", sum)
	}
	if recs, _ := ModelUsage(log, m)(ctx, "acme", time.Now().Add(time.Hour), time.Time{}); len(recs) != 0 {
		t.Fatalf("records after the range: %v", recs)
	}
}
