package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlite"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// sessionServer is an API server with sessions and no engine (the sessions
// here use no tools, so no sandbox).
func sessionServer(t *testing.T) (*client.Client, string, *server.Server) {
	t.Helper()
	dir := t.TempDir()
	m, err := sqlmeta.Open(filepath.Join(dir, "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	lg, err := sqlite.Open(filepath.Join(dir, "events.db"), sqlite.Options{Logger: enginetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	key := "amber_session_test_key"
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: meta.DefaultTenant, Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	mgr := session.NewManager(&session.Harness{Log: lg, Registry: eventlog.NewRegistry(), Meta: m, Logger: enginetest.Logger(t)})
	srv := server.New(server.Options{Meta: m, Sessions: mgr, Logger: enginetest.Logger(t)})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(mgr.Close)
	cl, _ := client.New(ts.URL, key)
	return cl, ts.URL + "|" + key, srv
}

// TestSessionSSE: a stream shows live deltas (no id) and each event once
// with id = its sequence; a reconnect with Last-Event-ID resumes after it;
// a bad Last-Event-ID is 400; a client event of a type clients may not send
// is 400; an idempotent post is appended once.
func TestSessionSSE(t *testing.T) {
	cl, urlKey, _ := sessionServer(t)
	base, key, _ := strings.Cut(urlKey, "|")
	ctx := ctxT(t)
	s, err := cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted",
		"script": []any{map[string]any{"text": "hello there"}, map[string]any{"text": "second answer"}}}})
	if err != nil {
		t.Fatal(err)
	}

	// Open the stream first, then talk: the answer's delta arrives live.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var seen []api.Event
	var deltas []string
	done := make(chan error, 1)
	go func() {
		_, err := cl.StreamSessionEvents(sctx, s.ID, 0, true, func(ev api.Event) error {
			if ev.Seq == 0 {
				deltas = append(deltas, string(ev.Payload))
				return nil
			}
			seen = append(seen, ev)
			var st struct{ Status string }
			json.Unmarshal(ev.Payload, &st)
			if ev.Type == session.EventStatus && st.Status == "idle" {
				return errors.New("stop")
			}
			return nil
		})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the stream is connected
	msg := api.PostSessionEventRequest{Type: "user_message", ID: "m1", Payload: json.RawMessage(`{"text":"hi"}`)}
	ev1, err := cl.PostSessionEvent(ctx, s.ID, msg)
	if err != nil {
		t.Fatal(err)
	}
	ev2, err := cl.PostSessionEvent(ctx, s.ID, msg) // a retry
	if err != nil || ev2.Seq != ev1.Seq {
		t.Fatalf("idempotent retry: %+v %v (first at %d)", ev2, err, ev1.Seq)
	}
	if err := <-done; err == nil || err.Error() != "stop" {
		t.Fatalf("stream: %v", err)
	}
	for i, ev := range seen {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	if len(deltas) != 1 || !strings.Contains(deltas[0], "hello there") {
		t.Fatalf("live deltas %q", deltas)
	}

	// Resume after the last event seen: only the new ones come.
	last := seen[len(seen)-1].Seq
	if _, err := cl.PostSessionEvent(ctx, s.ID, api.PostSessionEventRequest{Type: "session.user_message", Payload: json.RawMessage(`{"text":"again"}`)}); err != nil {
		t.Fatal(err)
	}
	var more []api.Event
	_, err = cl.StreamSessionEvents(sctx, s.ID, last, false, func(ev api.Event) error {
		more = append(more, ev)
		if ev.Type == session.EventAssistantMessage {
			return errors.New("stop")
		}
		return nil
	})
	if err == nil || len(more) == 0 || more[0].Seq != last+1 || more[0].Type != session.EventUserMessage {
		t.Fatalf("resumed stream: %v %+v", err, more)
	}
	all, err := cl.SessionEvents(ctx, s.ID, last, 0)
	if err != nil || len(all.Events) < len(more) || all.Events[0].Seq != last+1 {
		t.Fatalf("events after %d: %+v %v", last, all, err)
	}

	// Refusals.
	req, _ := http.NewRequest("GET", base+"/v1/sessions/"+s.ID+"/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Last-Event-ID", "seven")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("bad Last-Event-ID: %d", resp.StatusCode)
	}
	if _, err := cl.PostSessionEvent(ctx, s.ID, api.PostSessionEventRequest{Type: "assistant_message", Payload: json.RawMessage(`{"text":"forged"}`)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a client posting an assistant message: %v", err)
	}
	if _, err := cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "gpt-nothing"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown adapter: %v", err)
	}
}

// TestCreateSessionRefusesDaemonEnv: a definition naming a daemon
// environment variable (model.api_key_env) is a 400 that names the field,
// and no session is made; a provider the daemon does not offer is a 400 too.
func TestCreateSessionRefusesDaemonEnv(t *testing.T) {
	cl, urlKey, _ := sessionServer(t)
	base, key, _ := strings.Cut(urlKey, "|")
	for _, c := range []struct{ body, says string }{
		{`{"model":{"adapter":"anthropic","base_url":"http://127.0.0.1:9/","api_key_env":"PGPASSWORD"}}`, "model.api_key_env"},
		{`{"model":{"adapter":"openai","api_key_env":"OPENAI_API_KEY"}}`, "model.api_key_env"},
		{`{"model":{"adapter":"anthropic","provider":"corp"}}`, `model.provider "corp" is not a model provider this daemon offers`},
		{`{"model":{"adapter":"anthropic","provider":"corp","base_url":"http://x"}}`, "exclude each other"},
	} {
		req, _ := http.NewRequest("POST", base+"/v1/sessions", strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error.Kind != "invalid argument" || !strings.Contains(e.Error.Message, c.says) {
			t.Errorf("%s: %d %+v, want 400 naming %s", c.body, resp.StatusCode, e.Error, c.says)
		}
	}
	if ss, err := cl.ListSessions(ctxT(t)); err != nil || len(ss) != 0 {
		t.Fatalf("sessions after refused creates: %v %v", ss, err)
	}
}
