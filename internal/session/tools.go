package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Sandboxes is what the harness needs from the engine: a session's sandbox
// made lazily, commands and files in it, and checkpoints tied to step
// boundaries. EngineSandboxes adapts *engine.Engine; tests may use a fake.
type Sandboxes interface {
	// Create makes a sandbox of template for tenant with labels (kept with
	// the sandbox from before it runs, so a caller that dies after the
	// create finds it by them) and returns its id.
	Create(ctx context.Context, tenant, template string, labels map[string]string) (string, error)
	// Labeled lists tenant's sandboxes that this harness can use,
	// destroyed ones excepted, whose labels hold every pair of labels,
	// oldest first.
	Labeled(ctx context.Context, tenant string, labels map[string]string) ([]string, error)
	// Running says whether the sandbox is running (false when it crashed,
	// was killed, or is gone).
	Running(ctx context.Context, tenant, id string) (bool, error)
	Exec(ctx context.Context, tenant, id string, r ExecRequest) (ExecResult, error)
	ReadFile(ctx context.Context, tenant, id, path string) ([]byte, error)
	WriteFile(ctx context.Context, tenant, id, path string, data []byte) error
	// Checkpoint cuts and commits a checkpoint and returns its id once it
	// is durable.
	Checkpoint(ctx context.Context, tenant, id string) (string, error)
	// Restore brings sandbox id back, in place, to checkpoint ckpt.
	Restore(ctx context.Context, tenant, id, ckpt string) error
	Destroy(ctx context.Context, tenant, id string) error
}

// ExecRequest runs Args with Stdin, killed after Timeout.
type ExecRequest struct {
	Args    []string
	Stdin   []byte
	Timeout time.Duration
	// Detached runs the command as a background process of the sandbox
	// (started by its init, like `amber exec -d`) and waits for it: what
	// it leaves running (a server started with &) is part of the sandbox
	// and of its checkpoints under every driver. Output is combined into
	// Stdout; Stdin is not supported.
	Detached bool
}

// ExecResult is a command's outcome.
type ExecResult struct {
	Stdout, Stderr []byte
	Code           int
	TimedOut       bool
}

// BuiltinTools are the tools the harness runs itself.
var BuiltinTools = []string{"bash", "read_file", "write_file", "edit_file", "http"}

// changes says whether a built-in tool may change the sandbox or the world
// (strict policy checkpoints after those before acknowledging them, and a
// cut-off one re-runs in the sandbox restored from the cut before it).
// http counts: its request leaves through the gateway, whose journal keys
// requests relative to cuts, so a re-run from the cut before it meets the
// recorded effect instead of placing it again; re-run in a sandbox that
// was not restored, it would be a new request.
func changes(tool string) bool {
	return tool == "bash" || tool == "write_file" || tool == "edit_file" || tool == "http"
}

// needsSandbox says whether a tool runs in the sandbox.
func needsSandbox(tool string) bool {
	return tool != "" && strings.Contains(" bash read_file write_file edit_file http ", " "+tool+" ")
}

// maxOutput bounds what a tool result carries.
const maxOutput = 64 << 10

func toolSpecs(d Definition) []ToolSpec {
	all := map[string]ToolSpec{
		"bash": {Name: "bash", Description: "Run a shell command in the sandbox (/bin/sh -c). Returns exit code, stdout and stderr.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"timeout_seconds":{"type":"integer"}},"required":["command"]}`)},
		"read_file": {Name: "read_file", Description: "Read a file in the sandbox.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
		"write_file": {Name: "write_file", Description: "Write (create or replace) a file in the sandbox.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"]}`)},
		"edit_file": {Name: "edit_file", Description: "Replace exactly one occurrence of old_text with new_text in a file in the sandbox.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"old_text":{"type":"string"},"new_text":{"type":"string"}},"required":["path","old_text","new_text"]}`)},
		"http": {Name: "http", Description: "Send an HTTP request from inside the sandbox (through its egress gateway). Returns status and body.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"method":{"type":"string"},"url":{"type":"string"},"headers":{"type":"object","additionalProperties":{"type":"string"}},"body":{"type":"string"}},"required":["url"]}`)},
	}
	var out []ToolSpec
	for _, n := range d.Tools {
		out = append(out, all[n])
	}
	return append(out, d.CustomTools...)
}

// httpScript runs one request with Python's standard library, reading the
// request as JSON on stdin and printing the answer as JSON.
const httpScript = `import json,sys,urllib.request,urllib.error
r=json.load(sys.stdin)
data=r.get("body")
req=urllib.request.Request(r["url"],data=data.encode() if data is not None else None,method=r.get("method") or "GET",headers=r.get("headers") or {})
try:
    resp=urllib.request.urlopen(req,timeout=60); st=resp.status; b=resp.read()
except urllib.error.HTTPError as e:
    st=e.code; b=e.read()
print(json.dumps({"status":st,"body":b.decode("utf-8","replace")}))
`

// runTool runs built-in tool c in sandbox sbx and returns its output
// (isErr: the tool failed; err: the harness could not run it at all).
func runTool(ctx context.Context, sb Sandboxes, tenant, sbx string, c ToolCall) (out string, isErr bool, err error) {
	var in struct {
		Command        string            `json:"command"`
		TimeoutSeconds int               `json:"timeout_seconds"`
		Path           string            `json:"path"`
		Content        string            `json:"content"`
		OldText        string            `json:"old_text"`
		NewText        string            `json:"new_text"`
		Method         string            `json:"method"`
		URL            string            `json:"url"`
		Headers        map[string]string `json:"headers"`
		Body           *string           `json:"body"`
	}
	if err := json.Unmarshal(c.Input, &in); err != nil {
		return fmt.Sprintf("input does not decode: %v", err), true, nil
	}
	switch c.Name {
	case "bash":
		to := time.Duration(in.TimeoutSeconds) * time.Second
		if to <= 0 || to > 30*time.Minute {
			to = 10 * time.Minute
		}
		r, err := sb.Exec(ctx, tenant, sbx, ExecRequest{Args: []string{"/bin/sh", "-c", in.Command}, Timeout: to, Detached: true})
		if err != nil {
			return "", false, err
		}
		s := fmt.Sprintf("exit %d", r.Code)
		if r.TimedOut {
			s += " (timed out)"
		}
		s += "\n" + string(r.Stdout)
		if len(r.Stderr) > 0 {
			s += "\n[stderr]\n" + string(r.Stderr)
		}
		return clip(s), r.Code != 0, nil
	case "read_file":
		b, err := sb.ReadFile(ctx, tenant, sbx, in.Path)
		if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
			return err.Error(), true, nil
		}
		if err != nil {
			return "", false, err
		}
		return clip(string(b)), false, nil
	case "write_file":
		if err := sb.WriteFile(ctx, tenant, sbx, in.Path, []byte(in.Content)); err != nil {
			if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
				return err.Error(), true, nil
			}
			return "", false, err
		}
		return fmt.Sprintf("wrote %d bytes to %s", len(in.Content), in.Path), false, nil
	case "edit_file":
		b, err := sb.ReadFile(ctx, tenant, sbx, in.Path)
		if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
			return err.Error(), true, nil
		}
		if err != nil {
			return "", false, err
		}
		switch n := strings.Count(string(b), in.OldText); {
		case in.OldText == "":
			return "old_text is empty", true, nil
		case n != 1:
			return fmt.Sprintf("old_text occurs %d times in %s; it must occur exactly once", n, in.Path), true, nil
		}
		if err := sb.WriteFile(ctx, tenant, sbx, in.Path, []byte(strings.Replace(string(b), in.OldText, in.NewText, 1))); err != nil {
			return "", false, err
		}
		return "edited " + in.Path, false, nil
	case "http":
		req, _ := json.Marshal(map[string]any{"method": in.Method, "url": in.URL, "headers": in.Headers, "body": in.Body})
		r, err := sb.Exec(ctx, tenant, sbx, ExecRequest{Args: []string{"python3", "-c", httpScript}, Stdin: req, Timeout: 2 * time.Minute})
		if err != nil {
			return "", false, err
		}
		if r.Code != 0 {
			return clip(fmt.Sprintf("request failed (exit %d): %s", r.Code, r.Stderr)), true, nil
		}
		return clip(strings.TrimSpace(string(r.Stdout))), false, nil
	}
	return fmt.Sprintf("unknown tool %q", c.Name), true, nil
}

func clip(s string) string {
	if len(s) > maxOutput {
		return s[:maxOutput] + fmt.Sprintf("\n[%d bytes cut]", len(s)-maxOutput)
	}
	return s
}
