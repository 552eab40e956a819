package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/logging"
)

// mcpCodeForbidden is the JSON-RPC error code of a tool the caller's key may
// not call (in the range JSON-RPC leaves to servers).
const mcpCodeForbidden = -32003

// mcpHints are a tool's annotations (MCP ToolAnnotations): whether it only
// looks, may destroy what is there, may be repeated with no further effect,
// and reaches outside Amber (a command's network).
type mcpHints struct{ readOnly, destructive, idempotent, openWorld bool }

func (h mcpHints) annotations() *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{ReadOnlyHint: h.readOnly, DestructiveHint: &h.destructive,
		IdempotentHint: h.idempotent, OpenWorldHint: &h.openWorld}
}

var (
	mcpLooks   = mcpHints{readOnly: true, idempotent: true}
	mcpAdds    = mcpHints{}
	mcpReplace = mcpHints{destructive: true, idempotent: true}
	mcpRuns    = mcpHints{destructive: true, openWorld: true}
)

// addMCPTools registers the tools on srv. On a read-only key's server a
// call of a tool that changes things is answered, before its arguments are
// even read, with a JSON-RPC error naming the scope it needs.
func addMCPTools(srv *mcp.Server, t mcpTools) {
	writes := map[string]bool{}
	defer func() {
		if t.write {
			return
		}
		srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if call, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" && call.Params != nil && writes[call.Params.Name] {
					return nil, &jsonrpc.Error{Code: mcpCodeForbidden,
						Message: fmt.Sprintf("tool %s needs an API key with scope write; this key of tenant %s has scope read", call.Params.Name, t.tenant)}
				}
				return next(ctx, method, req)
			}
		})
	}()
	mcpTool(srv, t, writes, "sandbox_create", "Create a sandbox from a template (e.g. python, minimal), with optional limits and environment; returns its id.", mcpAdds, t.create)
	mcpTool(srv, t, writes, "sandbox_list", "List your sandboxes.", mcpLooks, t.list)
	mcpTool(srv, t, writes, "sandbox_destroy", "Destroy a sandbox: its processes and files are gone (its checkpoints stay).", mcpReplace, t.destroy)
	mcpTool(srv, t, writes, "exec", "Run a command in a sandbox and wait for it; returns its exit code, stdout and stderr.", mcpRuns, t.exec)
	mcpTool(srv, t, writes, "process_start", "Start a command in the background in a sandbox; returns its pid (read its output with process_output).", mcpRuns, t.startProcess)
	mcpTool(srv, t, writes, "process_output", "Read a background process's output from a byte offset, and its exit status once it ended.", mcpLooks, t.processOutput)
	mcpTool(srv, t, writes, "read_file", "Read a file of a sandbox (at most 1 MiB; a binary file comes back base64-encoded).", mcpLooks, t.readFile)
	mcpTool(srv, t, writes, "list_dir", "List a directory of a sandbox.", mcpLooks, t.listDir)
	mcpTool(srv, t, writes, "write_file", "Write a file in a sandbox (replacing it).", mcpReplace, t.writeFile)
	mcpTool(srv, t, writes, "checkpoint", "Checkpoint a sandbox (memory, processes, files); returns the checkpoint id.", mcpAdds, t.checkpoint)
	mcpTool(srv, t, writes, "checkpoint_list", "List a sandbox's checkpoints, newest last.", mcpLooks, t.listCheckpoints)
	mcpTool(srv, t, writes, "restore", "Restore a sandbox in place from one of its checkpoints (what changed since is lost).", mcpReplace, t.restore)
	mcpTool(srv, t, writes, "fork", "Restore a checkpoint as a new sandbox, leaving the original as it is; returns the new sandbox's id.", mcpAdds, t.fork)
	mcpTool(srv, t, writes, "port_expose", "Expose a TCP port of a sandbox on a URL (it carries a token: keep it).", mcpHints{openWorld: true}, t.exposePort)
}

// mcpTool adds one tool with portable input and output schemas
// (mcpInputSchema: the Inspector's --strict check flags an output schema
// of ["null","array"] too; the tools never return null for a list) and
// its annotations, and notes in writes the tools that change things. On a
// read-only key's server a tool runs with the engine told not to resume an
// idle sandbox (the middleware does the same for the API's GETs). In a
// session a tool's context ends with the session's DELETE
// (mcpSessionCalls).
func mcpTool[In, Out any](srv *mcp.Server, t mcpTools, writes map[string]bool, name, desc string, h mcpHints, fn mcp.ToolHandlerFor[In, Out]) {
	tool := &mcp.Tool{Name: name, Description: desc, InputSchema: mcpInputSchema[In](), OutputSchema: mcpInputSchema[Out](), Annotations: h.annotations()}
	writes[name] = !h.readOnly
	inner := fn
	fn = func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		if !t.write {
			ctx = engine.WithoutResume(ctx)
		}
		if req != nil && req.Extra != nil && req.Extra.Header.Get(mcpRequestIDHeader) != "" {
			ctx = logging.With(ctx, logging.RequestID, req.Extra.Header.Get(mcpRequestIDHeader))
		}
		if req != nil && req.Session != nil && req.Session.ID() != "" {
			var release func()
			ctx, release = t.s.mcpEndpointFor().calls.bind(ctx, t.s, req.Session.ID())
			defer release()
		}
		return inner(ctx, req, in)
	}
	mcp.AddTool(srv, tool, fn)
}

// mcpInputSchema is T's JSON schema in the subset every major
// function-calling API accepts: one type per schema (a Go slice or map is
// inferred as ["null", "array"], which several reject), no
// additionalProperties, and "properties" on every object.
func mcpInputSchema[T any]() *jsonschema.Schema {
	sc, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp input schema of %T: %v", *new(T), err)) // a programming error: the types are ours
	}
	portableSchema(sc)
	return sc
}

func portableSchema(sc *jsonschema.Schema) {
	if sc == nil {
		return
	}
	if len(sc.Types) > 0 {
		for _, ty := range sc.Types {
			if ty != "null" {
				sc.Type = ty
			}
		}
		sc.Types = nil
	}
	sc.AdditionalProperties = nil
	if sc.Type == "object" && sc.Properties == nil {
		sc.Properties = map[string]*jsonschema.Schema{}
	}
	for _, p := range sc.Properties {
		portableSchema(p)
	}
	portableSchema(sc.Items)
}

type (
	mcpSandboxIn struct {
		Sandbox string `json:"sandbox"`
	}
	mcpDoneOut struct {
		Done bool `json:"done"`
	}
	mcpFileOut struct {
		Content string `json:"content"`
		// Encoding is "utf-8" or, for a file that is not text, "base64".
		Encoding  string `json:"encoding"`
		Size      int64  `json:"size"`
		Truncated bool   `json:"truncated,omitempty"`
	}
	mcpDirOut struct {
		Path    string     `json:"path"`
		Entries []mcpEntry `json:"entries"`
	}
	mcpEntry struct {
		Name string `json:"name"`
		Type string `json:"type"`
		Size int64  `json:"size"`
	}
	mcpCheckpointsOut struct {
		Checkpoints []mcpCheckpoint `json:"checkpoints"`
	}
	mcpCheckpoint struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Tag     string `json:"tag,omitempty"`
		Parent  string `json:"parent,omitempty"`
		Created string `json:"created"`
	}
	mcpStartIn struct {
		Sandbox string   `json:"sandbox"`
		Command []string `json:"command" jsonschema:"program and arguments, e.g. [\"python3\", \"-m\", \"http.server\"]"`
		Env     []string `json:"env,omitempty" jsonschema:"entries of the form KEY=VALUE"`
		Cwd     string   `json:"cwd,omitempty" jsonschema:"the working directory"`
	}
	mcpPIDOut struct {
		PID int `json:"pid"`
	}
	mcpOutputIn struct {
		Sandbox string `json:"sandbox"`
		PID     int    `json:"pid"`
		Offset  int64  `json:"offset,omitempty" jsonschema:"the byte offset to read from (next_offset of the last call)"`
	}
	mcpOutputOut struct {
		Stdout     string `json:"stdout"`
		Stderr     string `json:"stderr"`
		NextOffset int64  `json:"next_offset"`
		Running    bool   `json:"running" jsonschema:"true while the process runs or output remains: call again from next_offset"`
		ExitCode   *int   `json:"exit_code,omitempty"`
	}
	mcpPortIn struct {
		Sandbox string `json:"sandbox"`
		Port    int    `json:"port"`
	}
	mcpPortOut struct {
		URL string `json:"url"`
	}
)

func (t mcpTools) destroy(ctx context.Context, _ *mcp.CallToolRequest, in mcpSandboxIn) (*mcp.CallToolResult, mcpDoneOut, error) {
	err := t.eng.Destroy(ctx, t.tenant, in.Sandbox)
	return nil, mcpDoneOut{Done: err == nil}, err
}

// readFile returns at most mcpMaxOutput bytes of a file: the reader stops
// at the cap (capped with stop), so a large file is neither held nor read
// whole. A file that is not UTF-8 text comes back as an embedded resource
// with a base64 blob, and base64 in the structured result.
func (t mcpTools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in mcpPathIn) (*mcp.CallToolResult, mcpFileOut, error) {
	fs, err := t.eng.Files(ctx, t.tenant, in.Sandbox)
	if err != nil {
		return nil, mcpFileOut{}, err
	}
	p := in.Path // the sandbox's FS refuses a relative one, as write_file's does
	fi, err := fs.Stat(ctx, p)
	if err != nil {
		return nil, mcpFileOut{}, err
	}
	if fi.Mode.IsDir() {
		return nil, mcpFileOut{}, fmt.Errorf("%s is a directory (use list_dir)", p)
	}
	b := capped{stop: true}
	if err := fs.ReadFile(ctx, p, &b); err != nil && b.dropped == 0 {
		return nil, mcpFileOut{}, err
	}
	data := b.buf.Bytes()
	out := mcpFileOut{Encoding: "utf-8", Size: max(fi.Size, int64(len(data))), Truncated: b.dropped > 0}
	if text, ok := utf8Prefix(data, out.Truncated); ok {
		out.Content = string(text)
		return nil, out, nil
	}
	out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
		URI: "amber://sandboxes/" + in.Sandbox + "/files" + p, MIMEType: "application/octet-stream", Blob: data}}}}
	return res, out, nil
}

// utf8Prefix reports whether data is text; a cut one may end inside a
// character, which is dropped.
func utf8Prefix(data []byte, cut bool) ([]byte, bool) {
	if utf8.Valid(data) {
		return data, true
	}
	for i := 1; cut && i < utf8.UTFMax && i <= len(data); i++ {
		if utf8.Valid(data[:len(data)-i]) {
			return data[:len(data)-i], true
		}
	}
	return nil, false
}

func (t mcpTools) listDir(ctx context.Context, _ *mcp.CallToolRequest, in mcpPathIn) (*mcp.CallToolResult, mcpDirOut, error) {
	fs, err := t.eng.Files(ctx, t.tenant, in.Sandbox)
	if err != nil {
		return nil, mcpDirOut{}, err
	}
	p := in.Path // the sandbox's FS refuses a relative one, as write_file's does
	ents, err := fs.List(ctx, p)
	if err != nil {
		return nil, mcpDirOut{}, err
	}
	out := mcpDirOut{Path: p, Entries: []mcpEntry{}}
	for _, e := range ents {
		f := toAPIFile(e)
		out.Entries = append(out.Entries, mcpEntry{Name: f.Name, Type: f.Type, Size: f.Size})
	}
	return nil, out, nil
}

func (t mcpTools) listCheckpoints(ctx context.Context, _ *mcp.CallToolRequest, in mcpSandboxIn) (*mcp.CallToolResult, mcpCheckpointsOut, error) {
	cks, err := t.eng.ListCheckpoints(ctx, t.tenant, in.Sandbox, false)
	out := mcpCheckpointsOut{Checkpoints: []mcpCheckpoint{}}
	for _, ck := range cks {
		out.Checkpoints = append(out.Checkpoints, mcpCheckpoint{ID: ck.ID, State: string(ck.State), Tag: ck.Tag, Parent: ck.Parent,
			Created: ck.Created.UTC().Format("2006-01-02T15:04:05Z07:00")})
	}
	return nil, out, err
}

func (t mcpTools) fork(ctx context.Context, _ *mcp.CallToolRequest, in mcpRestoreIn) (*mcp.CallToolResult, mcpSandboxOut, error) {
	sb, err := t.eng.Restore(ctx, engine.RestoreRequest{Tenant: t.tenant, Checkpoint: in.Checkpoint, AsNew: true})
	return nil, mcpSandboxOut{Sandbox: sb.ID}, err
}

func (t mcpTools) startProcess(ctx context.Context, _ *mcp.CallToolRequest, in mcpStartIn) (*mcp.CallToolResult, mcpPIDOut, error) {
	if len(in.Command) == 0 {
		return nil, mcpPIDOut{}, fmt.Errorf("command is empty")
	}
	if err := t.s.limits.checkCommand("process", in.Command, in.Env); err != nil {
		return nil, mcpPIDOut{}, err
	}
	pid, err := t.eng.StartProcess(ctx, t.tenant, in.Sandbox, sandbox.ExecSpec{Args: in.Command, Env: in.Env, Cwd: in.Cwd})
	return nil, mcpPIDOut{PID: pid}, err
}

// processOutput reads what the process has written since in.Offset (not
// following: the tool answers now), at most mcpMaxOutput bytes of it. The
// stream of an ended process ends with its exit frame once every byte was
// sent; Running stays true while output remains past the cap.
func (t mcpTools) processOutput(ctx context.Context, _ *mcp.CallToolRequest, in mcpOutputIn) (*mcp.CallToolResult, mcpOutputOut, error) {
	out := mcpOutputOut{NextOffset: in.Offset, Running: true}
	var stdout, stderr bytes.Buffer
	err := t.eng.ProcessOutput(ctx, t.tenant, in.Sandbox, in.PID, in.Offset, false, func(f sandbox.OutputFrame) error {
		switch f.Kind {
		case "stdout", "stderr":
			if stdout.Len()+stderr.Len()+len(f.Data) > mcpMaxOutput && stdout.Len()+stderr.Len() > 0 {
				return errCapped
			}
			if f.Kind == "stdout" {
				stdout.Write(f.Data)
			} else {
				stderr.Write(f.Data)
			}
			out.NextOffset = f.Offset + int64(len(f.Data))
		case "rewound", "lost":
			out.NextOffset = f.Offset
		case "exited":
			if f.Exit != nil {
				out.Running, out.ExitCode = false, &f.Exit.Code
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errCapped) {
		return nil, mcpOutputOut{}, err
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	return nil, out, nil
}

func (t mcpTools) exposePort(ctx context.Context, _ *mcp.CallToolRequest, in mcpPortIn) (*mcp.CallToolResult, mcpPortOut, error) {
	x, err := t.eng.Expose(ctx, t.tenant, in.Sandbox, in.Port)
	if err != nil {
		return nil, mcpPortOut{}, err
	}
	cl, _ := ctx.Value(mcpCallerKey{}).(mcpCaller)
	if cl.r == nil {
		return nil, mcpPortOut{}, fmt.Errorf("port %d exposed, but its URL is unknown here (see GET /v1/sandboxes/%s/ports)", in.Port, in.Sandbox)
	}
	return nil, mcpPortOut{URL: t.s.portURL(cl.r, x.SandboxID, x.Port, x.Token)}, nil
}

// capped keeps the first mcpMaxOutput bytes written and counts the rest;
// with stop it refuses the write that passes the cap, so a reader stops
// there. The buffer is a field, not embedded: an embedded bytes.Buffer's
// ReadFrom would let io.Copy fill it past the cap without calling Write.
type capped struct {
	buf     bytes.Buffer
	dropped int
	stop    bool
}

// errCapped is what a stopping capped answers past the cap.
var errCapped = errors.New("output cap reached")

func (c *capped) Write(p []byte) (int, error) {
	room := mcpMaxOutput - c.buf.Len()
	if room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	c.dropped += max(0, len(p)-max(room, 0))
	if c.stop && c.dropped > 0 {
		return max(room, 0), errCapped
	}
	return len(p), nil
}

func (c *capped) String() string {
	if c.dropped > 0 {
		return c.buf.String() + fmt.Sprintf("\n[%d bytes cut]", c.dropped)
	}
	return c.buf.String()
}
