package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/internal/state/meta"
)

// bearer adds an API key to every request of an MCP client.
type bearer struct {
	key  string
	base http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.base.RoundTrip(r)
}

func mcpSession(t *testing.T, url, key string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	s, err := c.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: url + "/v1/mcp",
		HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// call runs a tool and decodes its structured result into out; it returns
// the text of a tool error.
func call(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, out any) string {
	t.Helper()
	res, err := s.CallTool(ctxT(t), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return b.String()
	}
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%s: result %s: %v", name, raw, err)
	}
	return ""
}

// TestMCPTools drives a sandbox through the MCP endpoint with the SDK's
// own client: create, exec, files, checkpoint, restore (a file written
// after the cut is gone); another tenant's key finds none of it. (What a
// read-only key may do is TestMCPReadScope's.)
func TestMCPTools(t *testing.T) {
	_, env, url := newAPI(t)
	ctx := context.Background()
	s := mcpSession(t, url, testKey)
	tools, err := s.ListTools(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tl := range tools.Tools {
		names[tl.Name] = true
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "exec", "read_file", "write_file", "checkpoint", "restore"} {
		if !names[want] {
			t.Errorf("tool %s missing (have %v)", want, names)
		}
	}
	var sb struct{ Sandbox string }
	if msg := call(t, s, "sandbox_create", map[string]any{"template": "minimal"}, &sb); msg != "" || sb.Sandbox == "" {
		t.Fatalf("sandbox_create: %q %+v", msg, sb)
	}
	var ex struct {
		ExitCode int `json:"exit_code"`
		Stdout   string
	}
	if msg := call(t, s, "exec", map[string]any{"sandbox": sb.Sandbox, "command": []string{"sh", "-c", "echo hi; exit 3"}}, &ex); msg != "" || ex.ExitCode != 3 || ex.Stdout != "hi\n" {
		t.Fatalf("exec: %q %+v", msg, ex)
	}
	var w struct{ Bytes int }
	if msg := call(t, s, "write_file", map[string]any{"sandbox": sb.Sandbox, "path": "/root/a.txt", "content": "before"}, &w); msg != "" || w.Bytes != 6 {
		t.Fatalf("write_file: %q %+v", msg, w)
	}
	var ck struct{ Checkpoint string }
	if msg := call(t, s, "checkpoint", map[string]any{"sandbox": sb.Sandbox}, &ck); msg != "" || ck.Checkpoint == "" {
		t.Fatalf("checkpoint: %q %+v", msg, ck)
	}
	call(t, s, "write_file", map[string]any{"sandbox": sb.Sandbox, "path": "/root/b.txt", "content": "after"}, &w)
	var rs struct{ Sandbox string }
	if msg := call(t, s, "restore", map[string]any{"checkpoint": ck.Checkpoint}, &rs); msg != "" || rs.Sandbox != sb.Sandbox {
		t.Fatalf("restore: %q %+v", msg, rs)
	}
	var rf struct{ Content string }
	if msg := call(t, s, "read_file", map[string]any{"sandbox": sb.Sandbox, "path": "/root/a.txt"}, &rf); msg != "" || rf.Content != "before" {
		t.Fatalf("read_file after restore: %q %+v", msg, rf)
	}
	if msg := call(t, s, "read_file", map[string]any{"sandbox": sb.Sandbox, "path": "/root/b.txt"}, &rf); msg == "" {
		t.Fatal("a file written after the cut survived the restore")
	}

	// Another tenant: none of it exists.
	if _, err := env.Meta.CreateTenant(ctx, meta.Tenant{ID: "globex"}); err != nil {
		t.Fatal(err)
	}
	const otherKey = "amber_globex_mcp_test_key_000000000000000"
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "globex", Name: "k", Hash: meta.HashKey(otherKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	o := mcpSession(t, url, otherKey)
	if msg := call(t, o, "exec", map[string]any{"sandbox": sb.Sandbox, "command": []string{"true"}}, &ex); !strings.Contains(msg, "not found") {
		t.Fatalf("another tenant's exec on acme's sandbox: %q", msg)
	}
	var ls struct{ Sandboxes []struct{ ID string } }
	call(t, o, "sandbox_list", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 0 {
		t.Fatalf("another tenant lists %+v", ls.Sandboxes)
	}
}
