package session

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/internal/obs/logging"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestLogLinesNameTheSession: what the harness logs while it works on a
// session carries session_id and tenant_id (here: a status row it cannot
// write because the meta row is gone).
func TestLogLinesNameTheSession(t *testing.T) {
	e := newTestEnv(t, []ScriptTurn{{Text: "hello"}})
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal"})
	e.post(id, EventUserMessage, UserMessage{Text: "hi"})
	// A meta store without the session's row: the status copy fails.
	other, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var buf bytes.Buffer
	h := e.harness(nil)
	h.Meta = other
	h.Logger = slog.New(logging.NewHandler(slog.NewJSONHandler(&buf, nil)))
	if _, err := h.Wake(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if m["msg"] == "session status row" {
			found = true
			if m[logging.SessionID] != id || m[logging.TenantID] != "acme" {
				t.Fatalf("log line without the session's ids: %s", line)
			}
		}
	}
	if !found {
		t.Fatalf("no warning logged (the test provokes one):\n%s", buf.String())
	}
}
