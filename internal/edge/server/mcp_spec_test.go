package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/state/meta"
)

// rpc posts one JSON-RPC request to /v1/mcp as any MCP client would, with
// no SDK between the test and the wire, and returns the decoded answer.
func rpc(t *testing.T, url, key, method string, params any) map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequestWithContext(ctxT(t), "POST", url+"/v1/mcp", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d, %v", method, resp.StatusCode, err)
	}
	return out
}

// toolCall calls a tool over the wire and returns its result (failing on
// a JSON-RPC error).
func toolCall(t *testing.T, url, key, name string, args map[string]any) map[string]any {
	t.Helper()
	out := rpc(t, url, key, "tools/call", map[string]any{"name": name, "arguments": args})
	res, ok := out["result"].(map[string]any)
	if !ok {
		t.Fatalf("%s: no result: %v", name, out)
	}
	if res["isError"] == true {
		t.Fatalf("%s: tool error: %v", name, res["content"])
	}
	return res
}

// TestMCPMethodsNotAllowed: the streamable HTTP transport's GET (a
// standalone SSE stream) and DELETE (end a session) are not served by a
// stateless server, which must answer 405 with Allow (the official SDK's
// client reads 405 as "no stream" and goes on; a 404 is an error to it).
func TestMCPMethodsNotAllowed(t *testing.T) {
	_, _, url := newAPI(t)
	for _, m := range []string{"GET", "DELETE"} {
		for _, key := range []string{testKey, ""} {
			req, _ := http.NewRequestWithContext(ctxT(t), m, url+"/v1/mcp", nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			req.Header.Set("Accept", "text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
				t.Errorf("%s /v1/mcp (key %v): %d, Allow %q; want 405, Allow POST", m, key != "", resp.StatusCode, resp.Header.Get("Allow"))
			}
		}
	}
}

// portableKeywords are the JSON schema keywords the function-calling APIs
// of the major model providers all accept in a tool's parameters.
var portableKeywords = map[string]bool{"type": true, "description": true, "properties": true, "required": true, "items": true, "enum": true, "title": true}

// checkPortable walks a schema: one type (a string, never ["null", …]),
// only portable keywords, "properties" on every object.
func checkPortable(t *testing.T, where string, sc map[string]any) {
	t.Helper()
	for k := range sc {
		if !portableKeywords[k] {
			t.Errorf("%s: keyword %q", where, k)
		}
	}
	ty, ok := sc["type"].(string)
	if !ok {
		t.Errorf("%s: type %v is not one type", where, sc["type"])
	}
	if ty == "object" {
		props, ok := sc["properties"].(map[string]any)
		if !ok {
			t.Errorf("%s: an object without properties", where)
		}
		for name, p := range props {
			checkPortable(t, where+"."+name, p.(map[string]any))
		}
	}
	if ty == "array" {
		items, ok := sc["items"].(map[string]any)
		if !ok {
			t.Errorf("%s: an array without items", where)
			return
		}
		checkPortable(t, where+"[]", items)
	}
}

// TestMCPToolSchemas walks every tool of tools/list as it is on the wire:
// input schemas in the portable subset, and annotations that say which
// tools only look.
func TestMCPToolSchemas(t *testing.T) {
	_, _, url := newAPI(t)
	out := rpc(t, url, testKey, "tools/list", map[string]any{})
	tools := out["result"].(map[string]any)["tools"].([]any)
	readOnly := map[string]bool{"sandbox_list": true, "read_file": true, "list_dir": true, "checkpoint_list": true, "process_output": true}
	seen := map[string]bool{}
	for _, x := range tools {
		tl := x.(map[string]any)
		name := tl["name"].(string)
		seen[name] = true
		checkPortable(t, name, tl["inputSchema"].(map[string]any))
		ann, ok := tl["annotations"].(map[string]any)
		if !ok {
			t.Errorf("%s: no annotations", name)
			continue
		}
		for _, h := range []string{"readOnlyHint", "destructiveHint", "idempotentHint"} {
			if _, ok := ann[h].(bool); !ok {
				t.Errorf("%s: annotation %s missing", name, h)
			}
		}
		if ann["readOnlyHint"] != readOnly[name] {
			t.Errorf("%s: readOnlyHint %v", name, ann["readOnlyHint"])
		}
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "sandbox_destroy", "exec", "process_start", "process_output",
		"read_file", "list_dir", "write_file", "checkpoint", "checkpoint_list", "restore", "fork", "port_expose"} {
		if !seen[want] {
			t.Errorf("tool %s missing", want)
		}
	}
}

// TestMCPReadScope: a read-only key lists the tools and calls the ones that
// only look; the others answer a JSON-RPC error naming the scope.
func TestMCPReadScope(t *testing.T) {
	_, env, url := newAPI(t)
	const readKey = "amber_default_mcp_read_key_0000000000000000"
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "ro", Hash: meta.HashKey(readKey), Scopes: []meta.Scope{meta.ScopeRead}}); err != nil {
		t.Fatal(err)
	}
	s := mcpSession(t, url, readKey) // the SDK's client connects
	if tl, err := s.ListTools(ctxT(t), nil); err != nil || len(tl.Tools) < 14 {
		t.Fatalf("tools/list with a read key: %v", err)
	}
	res := toolCall(t, url, readKey, "sandbox_list", map[string]any{})
	if sc := res["structuredContent"].(map[string]any); sc["sandboxes"] == nil {
		t.Fatalf("sandbox_list: %v", res)
	}
	for _, name := range []string{"sandbox_create", "exec", "write_file"} {
		out := rpc(t, url, readKey, "tools/call", map[string]any{"name": name, "arguments": map[string]any{"template": "minimal"}})
		e, ok := out["error"].(map[string]any)
		if !ok || e["code"] != float64(-32003) || !strings.Contains(e["message"].(string), "scope write") {
			t.Errorf("%s with a read key: %v", name, out)
		}
	}
	if l, _ := env.Engine.List(context.Background(), "default"); len(l) != 0 {
		t.Fatalf("a read key's sandbox_create made %d sandboxes", len(l))
	}
}

// TestMCPReadFile: read_file stops at its cap (a 3 MiB file gives 1 MiB,
// truncated, with its size), so does exec's output, and a binary file comes back as an embedded
// resource with a base64 blob, not as mangled text.
func TestMCPReadFile(t *testing.T) {
	_, env, url := newAPI(t)
	sb := toolCall(t, url, testKey, "sandbox_create", map[string]any{"template": "minimal"})["structuredContent"].(map[string]any)["sandbox"].(string)
	fs, err := env.Engine.Files(ctxT(t), "default", sb)
	if err != nil {
		t.Fatal(err)
	}
	// Made inside the sandbox: the test is about reading it.
	if sc := toolCall(t, url, testKey, "exec", map[string]any{"sandbox": sb, "command": []string{"sh", "-c", "yes | head -c 3145728 > /root/big"}})["structuredContent"].(map[string]any); sc["exit_code"] != float64(0) {
		t.Fatalf("making /root/big: %v", sc)
	}
	bin := []byte{0x89, 'P', 'N', 'G', 0, 0xff, 0xfe, 0x80}
	if err := fs.WriteFile(ctxT(t), "/root/bin", bytes.NewReader(bin), 0o644); err != nil {
		t.Fatal(err)
	}

	sc := toolCall(t, url, testKey, "read_file", map[string]any{"sandbox": sb, "path": "/root/big"})["structuredContent"].(map[string]any)
	if n := len(sc["content"].(string)); n != 1<<20 || sc["truncated"] != true || sc["size"] != float64(3<<20) {
		t.Fatalf("read_file of 3 MiB: %d bytes, truncated %v, size %v", n, sc["truncated"], sc["size"])
	}

	// exec's output has the same cap.
	sc = toolCall(t, url, testKey, "exec", map[string]any{"sandbox": sb, "command": []string{"cat", "/root/big"}})["structuredContent"].(map[string]any)
	if out := sc["stdout"].(string); len(out) > 1<<20+64 || !strings.HasSuffix(out, "bytes cut]") {
		t.Fatalf("exec of 3 MiB of output: %d bytes, ending %q", len(out), out[max(0, len(out)-40):])
	}

	res := toolCall(t, url, testKey, "read_file", map[string]any{"sandbox": sb, "path": "/root/bin"})
	sc = res["structuredContent"].(map[string]any)
	if sc["encoding"] != "base64" || sc["content"] != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read_file of a binary file: %v", sc)
	}
	c := res["content"].([]any)[0].(map[string]any)
	r, _ := c["resource"].(map[string]any)
	if c["type"] != "resource" || r == nil || r["blob"] != base64.StdEncoding.EncodeToString(bin) || r["uri"] == "" || r["mimeType"] == "" {
		t.Fatalf("read_file of a binary file: content %v", c)
	}
}

// TestMCPAgentTools: the tools an agent cleans up and branches with —
// create with limits and env, list_dir, checkpoint_list, fork, a
// background process and its output, port_expose, destroy.
func TestMCPAgentTools(t *testing.T) {
	_, env, url := newAPI(t)
	s := mcpSession(t, url, testKey)
	var sb struct{ Sandbox string }
	if msg := call(t, s, "sandbox_create", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 128 << 20}, "env": []string{"FOO=bar"},
		"metadata": map[string]string{"task": "t-42"}, "timeout_seconds": 3600}, &sb); msg != "" {
		t.Fatalf("sandbox_create: %s", msg)
	}
	if got, err := env.Engine.Get(ctxT(t), "default", sb.Sandbox); err != nil || got.Limits.MemoryBytes != 128<<20 || got.Metadata["task"] != "t-42" || got.Expires.IsZero() {
		t.Fatalf("limits, metadata and deadline: %+v %v", got, err)
	}
	var labelled struct {
		Sandboxes []struct {
			ID       string
			Metadata map[string]string
		}
	}
	if msg := call(t, s, "sandbox_list", map[string]any{}, &labelled); msg != "" {
		t.Fatalf("sandbox_list: %s", msg)
	}
	if i := slices.IndexFunc(labelled.Sandboxes, func(x struct {
		ID       string
		Metadata map[string]string
	}) bool {
		return x.ID == sb.Sandbox
	}); i < 0 || labelled.Sandboxes[i].Metadata["task"] != "t-42" {
		t.Fatalf("sandbox_list shows the labels: %+v", labelled)
	}
	if msg := call(t, s, "sandbox_create", map[string]any{"template": "minimal", "metadata": map[string]string{"bad key": "x"}}, &sb); msg == "" {
		t.Fatal("sandbox_create with a bad metadata key succeeded")
	}
	var ex struct{ Stdout string }
	if msg := call(t, s, "exec", map[string]any{"sandbox": sb.Sandbox, "command": []string{"sh", "-c", "echo $FOO"}}, &ex); msg != "" || ex.Stdout != "bar\n" {
		t.Fatalf("exec with the sandbox's env: %q %q", msg, ex.Stdout)
	}
	var w struct{ Bytes int }
	call(t, s, "write_file", map[string]any{"sandbox": sb.Sandbox, "path": "/root/a.txt", "content": "hello"}, &w)
	var dir struct {
		Entries []struct{ Name, Type string }
	}
	if msg := call(t, s, "list_dir", map[string]any{"sandbox": sb.Sandbox, "path": "/root"}, &dir); msg != "" || !strings.Contains(fmtEntries(dir.Entries), "a.txt:file") {
		t.Fatalf("list_dir: %q %+v", msg, dir)
	}

	var ck struct{ Checkpoint string }
	if msg := call(t, s, "checkpoint", map[string]any{"sandbox": sb.Sandbox, "tag": "one"}, &ck); msg != "" {
		t.Fatalf("checkpoint: %s", msg)
	}
	var cks struct {
		Checkpoints []struct{ ID, Tag, State string }
	}
	if msg := call(t, s, "checkpoint_list", map[string]any{"sandbox": sb.Sandbox}, &cks); msg != "" || len(cks.Checkpoints) != 1 || cks.Checkpoints[0].ID != ck.Checkpoint || cks.Checkpoints[0].Tag != "one" {
		t.Fatalf("checkpoint_list: %q %+v", msg, cks)
	}
	var fork struct{ Sandbox string }
	if msg := call(t, s, "fork", map[string]any{"checkpoint": ck.Checkpoint}, &fork); msg != "" || fork.Sandbox == "" || fork.Sandbox == sb.Sandbox {
		t.Fatalf("fork: %q %+v", msg, fork)
	}
	var rf struct{ Content string }
	if msg := call(t, s, "read_file", map[string]any{"sandbox": fork.Sandbox, "path": "/root/a.txt"}, &rf); msg != "" || rf.Content != "hello" {
		t.Fatalf("read_file of the fork: %q %+v", msg, rf)
	}

	var ps struct{ PID int }
	if msg := call(t, s, "process_start", map[string]any{"sandbox": sb.Sandbox, "command": []string{"sh", "-c", "echo started; sleep 0.3; echo done >&2"}}, &ps); msg != "" || ps.PID == 0 {
		t.Fatalf("process_start: %q %+v", msg, ps)
	}
	var stdout, stderr string
	var offset int64
	for deadline := time.Now().Add(20 * time.Second); ; {
		var po struct {
			Stdout, Stderr string
			NextOffset     int64 `json:"next_offset"`
			Running        bool
			ExitCode       *int `json:"exit_code"`
		}
		if msg := call(t, s, "process_output", map[string]any{"sandbox": sb.Sandbox, "pid": ps.PID, "offset": offset}, &po); msg != "" {
			t.Fatalf("process_output: %s", msg)
		}
		stdout, stderr, offset = stdout+po.Stdout, stderr+po.Stderr, po.NextOffset
		if !po.Running {
			if po.ExitCode == nil || *po.ExitCode != 0 {
				t.Fatalf("process_output: ended with %v", po.ExitCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process is still running: %q %q", stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if stdout != "started\n" || stderr != "done\n" {
		t.Fatalf("process output %q %q", stdout, stderr)
	}

	var port struct{ URL string }
	if msg := call(t, s, "port_expose", map[string]any{"sandbox": sb.Sandbox, "port": 8000}, &port); msg != "" || !strings.Contains(port.URL, "8000-"+sb.Sandbox) {
		t.Fatalf("port_expose: %q %+v", msg, port)
	}

	var done struct{ Done bool }
	if msg := call(t, s, "sandbox_destroy", map[string]any{"sandbox": fork.Sandbox}, &done); msg != "" || !done.Done {
		t.Fatalf("sandbox_destroy: %q", msg)
	}
	var ls struct{ Sandboxes []struct{ ID string } }
	call(t, s, "sandbox_list", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].ID != sb.Sandbox {
		t.Fatalf("after destroying the fork: %+v", ls.Sandboxes)
	}
}

func fmtEntries(es []struct{ Name, Type string }) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.Name + ":" + e.Type + " ")
	}
	return b.String()
}
