package session

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Markers: values of the daemon's environment no tenant may ever see.
const (
	markerPG        = "marker-PGPASSWORD-7f3a"
	markerAnthropic = "marker-ANTHROPIC_API_KEY-91c2"
	markerOpenAI    = "marker-OPENAI_API_KEY-44d8"
)

// tenantListener is a tenant's own server: it records everything it is
// sent (request line, headers, body).
type tenantListener struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newTenantListener(t *testing.T) *tenantListener {
	l := &tenantListener{}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		l.seen = append(l.seen, fmt.Sprintf("%s %s %v %s", r.Method, r.URL, r.Header, b))
		l.mu.Unlock()
		http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"no"}}`, 401)
	}))
	t.Cleanup(l.srv.Close)
	return l
}

func (l *tenantListener) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// checkNothingReceived fails if the listener got any request, naming any
// marker it carried.
func (l *tenantListener) checkNothingReceived(t *testing.T, what string) {
	t.Helper()
	for _, r := range l.requests() {
		for _, m := range []string{markerPG, markerAnthropic, markerOpenAI} {
			if strings.Contains(r, m) {
				t.Errorf("%s: the tenant's listener received the daemon's %s: %.300s", what, m, r)
			}
		}
	}
	if n := len(l.requests()); n > 0 {
		t.Errorf("%s: the tenant's listener on 127.0.0.1 was dialled %d times (want refused at dial time)", what, n)
	}
}

func setMarkers(t *testing.T) {
	t.Setenv("PGPASSWORD", markerPG)
	t.Setenv("ANTHROPIC_API_KEY", markerAnthropic)
	t.Setenv("OPENAI_API_KEY", markerOpenAI)
}

// wakeEnv is a session test env whose harness uses the real adapters.
func wakeHarness(e *testEnv) *Harness {
	h := e.harness(nil)
	h.Models = NewModel
	return h
}

// TestModelKeyNeverFromDaemonEnv: a tenant's listener on 127.0.0.1 as
// model.base_url never receives a value of the daemon's environment:
// (a) api_key_env=PGPASSWORD is refused on create (400 naming the field);
// (b) with no key field at all (ANTHROPIC_API_KEY / OPENAI_API_KEY set),
// nothing falls back to the operator's key and the dial to 127.0.0.1 is
// refused; (c) a definition as the previous binary wrote it, already in
// the log and woken now, is refused by the same check (a session error
// event names api_key_env) or, without the field, refused at dial time;
// (d) a name that resolves to 127.0.0.1 is refused at dial time.
func TestModelKeyNeverFromDaemonEnv(t *testing.T) {
	setMarkers(t)
	ctx := context.Background()

	t.Run("a/api_key_env", func(t *testing.T) {
		l := newTenantListener(t)
		e := newTestEnv(t, nil)
		se, err := NewManager(wakeHarness(e)).Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "anthropic", Name: "m",
			BaseURL: l.srv.URL, APIKeyEnv: "PGPASSWORD"}, Template: "minimal"})
		if err == nil {
			e.post(se.ID, EventUserMessage, UserMessage{Text: "hi"})
			_, err := wakeHarness(e).Wake(ctx, se.ID)
			l.checkNothingReceived(t, "api_key_env=PGPASSWORD")
			t.Fatalf("a definition naming api_key_env was accepted (wake: %v)", err)
		}
		if !strings.Contains(err.Error(), "api_key_env") || !errdefs.IsInvalidArgument(err) {
			t.Fatalf("create with api_key_env: %v, want InvalidArgument naming model.api_key_env", err)
		}
		l.checkNothingReceived(t, "api_key_env=PGPASSWORD")
	})

	for _, adapter := range []string{"anthropic", "openai"} {
		t.Run("b/no-key/"+adapter, func(t *testing.T) {
			l := newTenantListener(t)
			e := newTestEnv(t, nil)
			base := l.srv.URL
			if adapter == "openai" {
				base += "/v1/"
			}
			id := e.create(Definition{Model: ModelConfig{Adapter: adapter, Name: "m", BaseURL: base}, Template: "minimal"})
			e.post(id, EventUserMessage, UserMessage{Text: "hi"})
			_, err := wakeHarness(e).Wake(ctx, id)
			l.checkNothingReceived(t, adapter+" without a key field")
			if err == nil || !strings.Contains(err.Error(), "refusing to dial") {
				t.Fatalf("wake: %v, want the dial to 127.0.0.1 refused", err)
			}
			if errs := e.events(id, EventError); len(errs) != 1 || !strings.Contains(string(errs[0].Payload), "refusing to dial") {
				t.Fatalf("error events: %v", errs)
			}
		})
	}

	// Definitions as the previous binary (bb41709) wrote them into the
	// session.created event: defaults filled in, api_key_env as given.
	for _, c := range []struct {
		name, model, says string
	}{
		{"c/old-log/api_key_env", `{"adapter":"anthropic","name":"m","base_url":%q,"api_key_env":"PGPASSWORD"}`, "api_key_env"},
		{"c/old-log/no-key", `{"adapter":"anthropic","name":"m","base_url":%q}`, "refusing to dial"},
		{"c/old-log/openai-no-key", `{"adapter":"openai","name":"m","base_url":%q}`, "refusing to dial"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newTenantListener(t)
			e := newTestEnv(t, nil)
			id := "ses-oldlog" + strings.NewReplacer("/", "", "_", "", "-", "").Replace(c.name)
			def := fmt.Sprintf(`{"model":`+c.model+`,"tools":["bash","read_file","write_file","edit_file","http"],"template":"minimal","policy":"strict","context_budget":200000,"fast_every":5}`, l.srv.URL+"/v1/")
			if _, err := e.log.Append(ctx, Stream(id), 0, 0, eventlog.Event{Tenant: "acme", ID: id + ".created", Type: EventCreated, Version: 1, Payload: []byte(def)}); err != nil {
				t.Fatal(err)
			}
			e.post(id, EventUserMessage, UserMessage{Text: "hi"})
			st, err := wakeHarness(e).Wake(ctx, id)
			l.checkNothingReceived(t, "an old definition woken")
			errs := e.events(id, EventError)
			if len(errs) != 1 || !strings.Contains(string(errs[0].Payload), c.says) {
				t.Fatalf("wake: %v %v; error events %v, want one naming %q", st, err, errs, c.says)
			}
			if c.says == "api_key_env" {
				// Refused, recorded, and the session waits (no retry loop).
				if err != nil || st != StatusIdle || !strings.Contains(e.state(id).StatusReason, "api_key_env") {
					t.Fatalf("wake: %v %v (reason %q), want idle with the refusal as reason", st, err, e.state(id).StatusReason)
				}
				// Woken again (a restart): the refusal is not recorded twice.
				if st, err := wakeHarness(e).Wake(ctx, id); err != nil || st != StatusIdle || len(e.events(id, EventError)) != 1 {
					t.Fatalf("second wake: %v %v, %d error events", st, err, len(e.events(id, EventError)))
				}
			}
		})
	}

	t.Run("d/name-resolving-to-loopback", func(t *testing.T) {
		l := newTenantListener(t)
		u, _ := url.Parse(l.srv.URL)
		e := newTestEnv(t, nil)
		id := e.create(Definition{Model: ModelConfig{Adapter: "anthropic", Name: "m", BaseURL: "http://localhost:" + u.Port()}, Template: "minimal"})
		e.post(id, EventUserMessage, UserMessage{Text: "hi"})
		_, err := wakeHarness(e).Wake(ctx, id)
		l.checkNothingReceived(t, "localhost")
		if err == nil || !strings.Contains(err.Error(), "refusing to dial") {
			t.Fatalf("wake: %v, want the dial refused", err)
		}
	})
}

// TestModelEgressAllowlist: a model endpoint the tenant chose meets the
// tenant's egress allowlist before anything is dialled (refused: a
// session error naming the allowlist, the session idles, nothing sent),
// and, once allowed, still the deny list at dial time; an operator's
// provider is not asked.
func TestModelEgressAllowlist(t *testing.T) {
	setMarkers(t)
	ctx := context.Background()
	l := newTenantListener(t)
	u, _ := url.Parse(l.srv.URL)
	type ask struct {
		tenant, host string
		port         uint16
	}
	var mu sync.Mutex
	var asked []ask
	allow := false
	harness := func(e *testEnv) *Harness {
		h := wakeHarness(e)
		h.EgressAllows = func(_ context.Context, tenant, host string, port uint16) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, ask{tenant, host, port})
			return allow, nil
		}
		return h
	}
	e := newTestEnv(t, nil)
	id := e.create(Definition{Model: ModelConfig{Adapter: "anthropic", Name: "m", BaseURL: l.srv.URL}, Template: "minimal"})
	e.post(id, EventUserMessage, UserMessage{Text: "hi"})
	st, err := harness(e).Wake(ctx, id)
	l.checkNothingReceived(t, "an endpoint outside the allowlist")
	if errs := e.events(id, EventError); err != nil || st != StatusIdle || len(errs) != 1 || !strings.Contains(string(errs[0].Payload), "egress allowlist") {
		t.Fatalf("wake: %v %v, error events %v: want idle with one error naming the egress allowlist", st, err, errs)
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] != (ask{"acme", "127.0.0.1", mustPort(t, u.Port())}) {
		t.Errorf("the allowlist was asked %+v, want once for acme 127.0.0.1:%s", asked, u.Port())
	}
	allow = true
	mu.Unlock()
	// Allowed now (a client event wakes it again): the deny list still refuses loopback at dial time.
	e.post(id, EventUserMessage, UserMessage{Text: "again"})
	_, err = harness(e).Wake(ctx, id)
	l.checkNothingReceived(t, "an allowed endpoint on loopback")
	if err == nil || !strings.Contains(err.Error(), "refusing to dial") {
		t.Fatalf("wake once allowed: %v, want the dial to 127.0.0.1 refused", err)
	}
}

func mustPort(t *testing.T, s string) uint16 {
	t.Helper()
	var p uint16
	if _, err := fmt.Sscan(s, &p); err != nil {
		t.Fatal(err)
	}
	return p
}
