package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/state/meta"
)

// postTicket asks for a terminal ticket of sandbox id with key.
func postTicket(t *testing.T, base, key, id string) (int, api.TerminalTicket) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/sandboxes/"+id+"/terminal", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tk api.TerminalTicket
	json.NewDecoder(resp.Body).Decode(&tk)
	return resp.StatusCode, tk
}

func wsURL(base, path string) string { return "ws" + strings.TrimPrefix(base, "http") + path }

// TestTerminal opens a shell on a PTY in a real sandbox over the terminal
// WebSocket and runs a command; then checks the ticket scheme: a ticket is
// single-use, bound to its sandbox and to the key's tenant, refused from
// another site's page (Origin), and a read-only key gets none.
func TestTerminal(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	put := func(tenant, name, key string, scopes ...meta.Scope) {
		if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: tenant, Name: name, Hash: meta.HashKey(key), Scopes: scopes}); err != nil {
			t.Fatal(err)
		}
	}
	const readKey, otherKey = "amber_test_read_key_0123456789abcdef", "amber_test_other_key_0123456789abcdef"
	put("default", "reader", readKey, meta.ScopeRead)
	put("globex", "owner", otherKey, meta.AllScopes...)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}

	code, tk := postTicket(t, base, testKey, sb.ID)
	if code != 201 || tk.Ticket == "" || !strings.Contains(tk.Path, "/v1/sandboxes/"+sb.ID+"/terminal/ws?ticket=") || time.Until(tk.Expires) > time.Minute {
		t.Fatalf("ticket: %d %+v", code, tk)
	}
	conn, _, err := websocket.Dial(ctx, wsURL(base, tk.Path)+"&cols=90&rows=30", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte("echo $((6*7))-term $COLUMNS; exit 3\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var exit struct {
		Exit *api.ExitStatus `json:"exit"`
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for exit.Exit == nil {
		typ, b, err := conn.Read(rctx)
		if err != nil {
			t.Fatalf("read: %v; output so far %q", err, out.String())
		}
		if typ == websocket.MessageBinary {
			out.Write(b)
			continue
		}
		if err := json.Unmarshal(b, &exit); err != nil || exit.Exit == nil {
			t.Fatalf("control message %s", b)
		}
	}
	if !strings.Contains(out.String(), "42-term 90") || exit.Exit.Code != 3 {
		t.Fatalf("terminal output %q, exit %+v; want 42-term 90 and code 3", out.String(), exit.Exit)
	}

	// The same ticket again: refused (single use).
	if _, resp, err := websocket.Dial(ctx, wsURL(base, tk.Path), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("ticket reused: %v %v", err, resp)
	}
	// A ticket of sb on sb2's terminal: refused, and spent.
	_, tk = postTicket(t, base, testKey, sb.ID)
	if _, resp, err := websocket.Dial(ctx, wsURL(base, strings.Replace(tk.Path, sb.ID, sb2.ID, 1)), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("ticket of another sandbox: %v %v", err, resp)
	}
	if _, resp, err := websocket.Dial(ctx, wsURL(base, tk.Path), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("ticket tried on another sandbox, then on its own: %v %v", err, resp)
	}
	// A page of another site cannot open it, even with a ticket.
	_, tk = postTicket(t, base, testKey, sb.ID)
	h := http.Header{"Origin": {"http://evil.example"}}
	if _, resp, err := websocket.Dial(ctx, wsURL(base, tk.Path), &websocket.DialOptions{HTTPHeader: h}); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("cross-origin terminal: %v %v", err, resp)
	}
	// No key, a read-only key, another tenant's key: no ticket.
	for _, k := range []struct {
		key  string
		want int
	}{{"", 401}, {readKey, 403}, {otherKey, 404}} {
		if code, tk := postTicket(t, base, k.key, sb.ID); code != k.want || tk.Ticket != "" {
			t.Errorf("ticket with key %.16q: %d %+v, want %d", k.key, code, tk, k.want)
		}
	}
	// No ticket at all.
	if _, resp, err := websocket.Dial(ctx, wsURL(base, "/v1/sandboxes/"+sb.ID+"/terminal/ws"), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("terminal without a ticket: %v %v", err, resp)
	}
}

// TestSandboxStats reads a running sandbox's resources; a stopped one has
// none to read.
func TestSandboxStats(t *testing.T) {
	c, _, base := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	get := func() (int, api.SandboxStats) {
		req, _ := http.NewRequest("GET", base+"/v1/sandboxes/"+sb.ID+"/stats", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st api.SandboxStats
		json.NewDecoder(resp.Body).Decode(&st)
		return resp.StatusCode, st
	}
	code, s1 := get()
	if code != 200 || s1.MemoryBytes == 0 || s1.CPUNanos == 0 || s1.DiskTotalBytes <= 0 || s1.DiskUsedBytes < 0 {
		t.Fatalf("stats: %d %+v", code, s1)
	}
	// A file of 8 MiB shows on the disk (or, where the root is in memory, in memory).
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "dd if=/dev/zero of=/big bs=1M count=8 2>/dev/null; sync"}}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	_, s2 := get()
	if s2.DiskUsedBytes-s1.DiskUsedBytes < 7<<20 && int64(s2.MemoryBytes)-int64(s1.MemoryBytes) < 7<<20 {
		t.Errorf("8 MiB written, stats before %+v after %+v", s1, s2)
	}
	if s2.CPUNanos < s1.CPUNanos {
		t.Errorf("cpu went back: %d then %d", s1.CPUNanos, s2.CPUNanos)
	}
	if _, err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(); code != 412 {
		t.Fatalf("stats of a killed sandbox: %d, want 412", code)
	}
}

// TestTerminalResize: with control=1 a resize message changes the
// terminal's size while the shell runs; without it the same text is input.
func TestTerminalResize(t *testing.T) {
	c, _, base := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	_, tk := postTicket(t, base, testKey, sb.ID)
	conn, _, err := websocket.Dial(ctx, wsURL(base, tk.Path)+"&cols=90&rows=30&control=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("stty size; read x; stty size; exit 0\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resized := false
	for {
		typ, b, err := conn.Read(rctx)
		if err != nil {
			t.Fatalf("read: %v; output so far %q", err, out.String())
		}
		if typ == websocket.MessageText {
			break // the exit
		}
		out.Write(b)
		if !resized && strings.Contains(out.String(), "30 90") {
			resized = true
			if err := conn.Write(ctx, websocket.MessageText, []byte(`{"resize":{"cols":120,"rows":40}}`)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // the resize goes its own way to the agent
			if err := conn.Write(ctx, websocket.MessageBinary, []byte("\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(out.String(), "30 90") || !strings.Contains(out.String(), "40 120") {
		t.Fatalf("terminal output %q: want the first size 30 90, then 40 120", out.String())
	}
}
