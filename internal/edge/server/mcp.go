package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/lib/httpx"
)

// MCP: /v1/mcp serves the caller's tenant's sandboxes as Model Context
// Protocol tools over the streamable HTTP transport (sessions with SSE
// answers, or sessionless JSON: mcp_session.go), so any MCP client can
// drive an Amber sandbox with its API key. Every request is authenticated
// like any other call; the route needs scope read (listing the tools and
// the tools that only look), and each tool that changes something checks
// for scope write itself, refusing a read-only key with a JSON-RPC error.
// Calls made with a write key are audited as before. An MCP session is
// bound to the key that opened it, so none can be carried to another key
// or tenant. The tools call the engine as the API does: another tenant's
// sandbox is not found.

type mcpCallerKey struct{}

// mcpCaller is what the per-key server factory and the tools know of the
// caller: its tenant, its key (the hash of its secret: the owner of the
// sessions it opens), whether the key may change things, and the request
// (for the URLs of exposed ports; in a session, the one that opened it).
type mcpCaller struct {
	tenant, keyHash string
	write           bool
	r               *http.Request
}

// mcp hands the request to the MCP handlers with the caller.
func (s *Server) mcp(w http.ResponseWriter, r *http.Request, c *call) error {
	cl := mcpCaller{tenant: c.tenant, keyHash: c.key.Hash, write: c.key.Has(write), r: r}
	if sw, ok := w.(*httpx.StatusWriter); ok && cl.write && r.Method == http.MethodPost {
		// The route's scope is read (a read-only key lists and looks), so
		// the middleware does not audit it: a write key's calls are, as
		// every call that may change something.
		defer s.record(r, Route{Method: "POST", Path: "/v1/mcp", Scope: write}, c, w.Header().Get("X-Request-Id"), sw, nil)
	}
	s.mcpServe(w, r.WithContext(context.WithValue(r.Context(), mcpCallerKey{}, cl)), cl)
	return nil
}

// mcpServer returns the MCP server of the caller's key (made once per key).
// A key may (write) or may not change things: both servers list every
// tool; on the read-only one the tools that change things refuse. The
// server is per key, not per tenant, because it holds the sessions the key
// opened (mcpOwns). No logging capability is advertised: the tools report
// through their results and progress notifications, and have no log
// stream to offer.
func (s *Server) mcpServer(cl mcpCaller) *mcp.Server {
	k := cl.tenant + "\x00" + cl.keyHash
	if v, ok := s.mcpServers.Load(k); ok {
		return v.(*mcp.Server)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "amber", Version: s.version}, &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{}})
	addMCPTools(srv, mcpTools{s: s, eng: s.eng, tenant: cl.tenant, write: cl.write})
	v, _ := s.mcpServers.LoadOrStore(k, srv)
	return v.(*mcp.Server)
}

type mcpTools struct {
	s      *Server
	eng    *engine.Engine
	tenant string
	write  bool // the caller's key has scope write
}

// mcpMaxOutput bounds what a tool returns of a command's output or a file.
const mcpMaxOutput = 1 << 20

type (
	mcpCreateIn struct {
		Template string            `json:"template" jsonschema:"the template, e.g. python or minimal"`
		Limits   mcpLimits         `json:"limits,omitempty" jsonschema:"resource limits; omitted ones take the daemon's defaults"`
		Env      []string          `json:"env,omitempty" jsonschema:"entries of the form KEY=VALUE, added to every process of the sandbox"`
		Metadata map[string]string `json:"metadata,omitempty" jsonschema:"labels of the sandbox (key to value), to find it again with sandbox_list; keys beginning amber. are Amber's own and refused"`
		Timeout  int64             `json:"timeout_seconds,omitempty" jsonschema:"seconds until the sandbox is killed (0: no deadline)"`
	}
	mcpLimits struct {
		MemoryBytes int64 `json:"memory_bytes,omitempty" jsonschema:"memory limit in bytes"`
		MilliCPUs   int64 `json:"millicpus,omitempty" jsonschema:"CPU limit in thousandths of a core (1000 is one core)"`
		Pids        int64 `json:"pids,omitempty" jsonschema:"the most processes at once"`
		DiskBytes   int64 `json:"disk_bytes,omitempty" jsonschema:"the writable layer's size in bytes"`
	}
	mcpSandboxOut struct {
		Sandbox string `json:"sandbox"`
	}
	mcpListOut struct {
		Sandboxes []mcpSandbox `json:"sandboxes"`
	}
	mcpSandbox struct {
		ID       string            `json:"id"`
		Template string            `json:"template"`
		State    string            `json:"state"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}
	mcpExecIn struct {
		Sandbox        string   `json:"sandbox"`
		Command        []string `json:"command" jsonschema:"program and arguments, e.g. [\"python3\", \"-c\", \"print(1)\"]"`
		TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"default 60, at most 3600"`
	}
	mcpExecOut struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		TimedOut bool   `json:"timed_out,omitempty"`
	}
	mcpPathIn struct {
		Sandbox string `json:"sandbox"`
		Path    string `json:"path" jsonschema:"an absolute path inside the sandbox"`
	}
	mcpWriteIn struct {
		Sandbox string `json:"sandbox"`
		Path    string `json:"path"`
		Content string `json:"content"`
	}
	mcpWriteOut struct {
		Bytes int `json:"bytes"`
	}
	mcpCheckpointIn struct {
		Sandbox string `json:"sandbox"`
		Tag     string `json:"tag,omitempty"`
	}
	mcpCheckpointOut struct {
		Checkpoint string `json:"checkpoint"`
	}
	mcpRestoreIn struct {
		Checkpoint string `json:"checkpoint"`
	}
)

func (t mcpTools) create(ctx context.Context, _ *mcp.CallToolRequest, in mcpCreateIn) (*mcp.CallToolResult, mcpSandboxOut, error) {
	l := fromAPILimits(api.Limits(in.Limits))
	if err := t.s.limits.checkSandbox(l); err != nil {
		return nil, mcpSandboxOut{}, err
	}
	if err := t.s.limits.checkEnv("sandbox", in.Env); err != nil {
		return nil, mcpSandboxOut{}, err
	}
	sb, err := t.eng.Create(ctx, engine.CreateRequest{Tenant: t.tenant, Template: in.Template, Limits: l, Env: in.Env,
		Metadata: in.Metadata, Timeout: time.Duration(in.Timeout) * time.Second})
	return nil, mcpSandboxOut{Sandbox: sb.ID}, err
}

func (t mcpTools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, mcpListOut, error) {
	rows, err := t.eng.List(ctx, t.tenant)
	out := mcpListOut{Sandboxes: []mcpSandbox{}}
	for _, sb := range rows {
		out.Sandboxes = append(out.Sandboxes, mcpSandbox{ID: sb.ID, Template: sb.Template, State: string(sb.State), Metadata: sb.Metadata})
	}
	return nil, out, err
}

// exec runs a command to its end. Asked for progress, it reports the
// command's output as it comes (mcpProgress); a cancelled call (the
// client's notifications/cancelled, or its session's end) cancels ctx,
// and the driver kills the command's process group.
func (t mcpTools) exec(ctx context.Context, req *mcp.CallToolRequest, in mcpExecIn) (*mcp.CallToolResult, mcpExecOut, error) {
	if len(in.Command) == 0 {
		return nil, mcpExecOut{}, fmt.Errorf("command is empty")
	}
	if err := t.s.limits.checkCommand("exec", in.Command, nil); err != nil {
		return nil, mcpExecOut{}, err
	}
	to := time.Duration(in.TimeoutSeconds) * time.Second
	if to <= 0 || to > time.Hour {
		to = time.Minute
	}
	var out, errb capped
	spec := sandbox.ExecSpec{Args: in.Command, Stdout: &out, Stderr: &errb, Timeout: to}
	p := startProgress(ctx, req, "exec")
	if p != nil {
		spec.Stdout, spec.Stderr = io.MultiWriter(&out, p), io.MultiWriter(&errb, p)
		spec.Started = func(pid int) { p.note(fmt.Sprintf("started as pid %d", pid)) }
	}
	st, err := t.eng.Exec(ctx, t.tenant, in.Sandbox, spec)
	if err != nil {
		p.end("exec failed")
		return nil, mcpExecOut{}, err
	}
	p.end(fmt.Sprintf("exited with code %d", st.Code))
	return nil, mcpExecOut{ExitCode: st.Code, Stdout: out.String(), Stderr: errb.String(), TimedOut: st.TimedOut}, nil
}

func (t mcpTools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in mcpWriteIn) (*mcp.CallToolResult, mcpWriteOut, error) {
	fs, err := t.eng.Files(ctx, t.tenant, in.Sandbox)
	if err != nil {
		return nil, mcpWriteOut{}, err
	}
	if err := fs.WriteFile(ctx, in.Path, strings.NewReader(in.Content), 0o644); err != nil {
		return nil, mcpWriteOut{}, err
	}
	return nil, mcpWriteOut{Bytes: len(in.Content)}, nil
}

// checkpoint takes a checkpoint; asked for progress, it says when it
// started, that it still runs (a large sandbox's memory takes seconds),
// and how it ended.
func (t mcpTools) checkpoint(ctx context.Context, req *mcp.CallToolRequest, in mcpCheckpointIn) (*mcp.CallToolResult, mcpCheckpointOut, error) {
	p := startProgress(ctx, req, "checkpoint of "+in.Sandbox)
	ck, err := t.eng.Checkpoint(ctx, engine.CheckpointRequest{Tenant: t.tenant, Sandbox: in.Sandbox, Tag: in.Tag})
	if err != nil {
		p.end("checkpoint failed")
	} else {
		p.end("checkpoint " + ck.ID + " taken")
	}
	return nil, mcpCheckpointOut{Checkpoint: ck.ID}, err
}

func (t mcpTools) restore(ctx context.Context, _ *mcp.CallToolRequest, in mcpRestoreIn) (*mcp.CallToolResult, mcpSandboxOut, error) {
	sb, err := t.eng.Restore(ctx, engine.RestoreRequest{Tenant: t.tenant, Checkpoint: in.Checkpoint})
	return nil, mcpSandboxOut{Sandbox: sb.ID}, err
}
