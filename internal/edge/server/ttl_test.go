package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/engine"
)

// TestSandboxMetadataTimeoutAndFilters: metadata and a timeout given at
// create come back in the sandbox's JSON (expires_at); list selects by
// state and metadata; POST …/timeout moves the deadline; a short timeout
// kills the sandbox; bad metadata, timeouts and filters are 400s.
func TestSandboxMetadataTimeoutAndFilters(t *testing.T) {
	c, _, base := newAPIWith(t, engine.Options{})
	ctx := ctxT(t)
	a, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Metadata: map[string]string{"team": "red", "job": "7"}, Timeout: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a.Metadata["team"] != "red" || a.Metadata["job"] != "7" || a.ExpiresAt == nil || a.OnTimeout != "" {
		t.Fatalf("created: %+v", a)
	}
	if d := time.Until(*a.ExpiresAt); d <= 0 || d > 2*time.Second {
		t.Fatalf("expires_at of a 2 s timeout is %v away", d)
	}
	b, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Metadata: map[string]string{"team": "blue"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.ExpiresAt != nil {
		t.Fatalf("a sandbox without a timeout has expires_at %v", b.ExpiresAt)
	}
	if got, err := c.GetSandbox(ctx, a.ID); err != nil || got.Metadata["job"] != "7" || got.ExpiresAt == nil {
		t.Fatalf("get: %+v %v", got, err)
	}
	// Move a's deadline out, then back in: 1 s.
	moved, err := c.SetTimeout(ctx, a.ID, 3600)
	if err != nil || moved.ExpiresAt == nil || time.Until(*moved.ExpiresAt) < 59*time.Minute {
		t.Fatalf("set timeout 3600: %+v %v", moved, err)
	}
	ids := func(f client.ListFilter) string {
		t.Helper()
		l, err := c.FindSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sb := range l {
			out = append(out, sb.ID)
		}
		return strings.Join(out, ",")
	}
	if got := ids(client.ListFilter{Metadata: map[string]string{"team": "red"}}); got != a.ID {
		t.Errorf("metadata team=red: %q", got)
	}
	if got := ids(client.ListFilter{Metadata: map[string]string{"team": "red", "job": "8"}}); got != "" {
		t.Errorf("metadata team=red,job=8: %q", got)
	}
	if got := ids(client.ListFilter{States: []string{"running"}}); got != a.ID+","+b.ID {
		t.Errorf("state running: %q", got)
	}
	if _, err := c.SetTimeout(ctx, a.ID, 1); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(30 * time.Second)
	for {
		cur, err := c.GetSandbox(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State == "stopped" {
			if !strings.HasPrefix(cur.Reason, "timed out") {
				t.Fatalf("expired: %+v", cur)
			}
			// The deadline is cleared by a write right after the kill's
			// (engine.expire): a read between the two sees it still.
			if cur.ExpiresAt == nil {
				break
			}
		}
		if time.Now().After(until) {
			t.Fatalf("not killed, or its deadline not cleared, 30 s after a 1 s timeout: %+v", cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := ids(client.ListFilter{States: []string{"stopped"}, Metadata: map[string]string{"team": "red"}}); got != a.ID {
		t.Errorf("state stopped, team=red: %q", got)
	}
	if got := ids(client.ListFilter{States: []string{"running,stopped"}}); got != a.ID+","+b.ID {
		t.Errorf("state running,stopped: %q", got)
	}

	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", `{"template":"minimal","metadata":{"a=b":"x"}}`},
		{"POST", "/v1/sandboxes", `{"template":"minimal","metadata":{"k":1}}`},
		{"POST", "/v1/sandboxes", `{"template":"minimal","timeout":-1}`},
		{"POST", "/v1/sandboxes", `{"template":"minimal","timeout":99999999}`},
		{"POST", "/v1/sandboxes", `{"template":"minimal","timeout":5,"on_timeout":"explode"}`},
		{"POST", "/v1/sandboxes/" + b.ID + "/timeout", `{"timeout":-5}`},
		{"POST", "/v1/sandboxes/" + b.ID + "/timeout", `{"timeout":"soon"}`},
		{"POST", "/v1/sandboxes/" + b.ID + "/timeout", ``},
		{"GET", "/v1/sandboxes?state=asleep", ``},
		{"GET", "/v1/sandboxes?metadata=novalue", ``},
		{"GET", "/v1/sandboxes?metadata==x", ``},
	} {
		var body *strings.Reader
		if bad.body != "" {
			body = strings.NewReader(bad.body)
		} else {
			body = strings.NewReader("")
		}
		if code, out := rawCall(t, ctx, bad.method, base+bad.path, "Bearer", "application/json", body); code != http.StatusBadRequest {
			t.Errorf("%s %s %s: %d %s, want 400", bad.method, bad.path, bad.body, code, out)
		}
	}
	// A killed sandbox takes no timeout.
	if code, out := rawCall(t, ctx, "POST", base+"/v1/sandboxes/"+a.ID+"/timeout", "Bearer", "application/json", strings.NewReader(`{"timeout":60}`)); code != http.StatusPreconditionFailed {
		t.Errorf("timeout on a killed sandbox: %d %s", code, out)
	}
}
