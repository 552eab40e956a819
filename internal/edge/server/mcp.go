package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/lib/httpx"
)

// MCP: POST /v1/mcp serves the caller's tenant's sandboxes as Model Context
// Protocol tools (streamable HTTP, stateless), so any MCP client can drive
// an Amber sandbox with its API key. Every request is authenticated like any
// other call; the route needs scope read (listing the tools and the tools
// that only look), and each tool that changes something checks for scope
// write itself, refusing a read-only key with a JSON-RPC error. Calls made
// with a write key are audited as before. Stateless means no MCP session
// outlives a request, so none can be carried to another tenant. The tools
// call the engine as the API does: another tenant's sandbox is not found.
// GET and DELETE, which a stateless server does not serve (no standalone
// SSE stream, no session to end), answer 405 with Allow: POST, as the
// streamable HTTP transport asks (mcpNotAllowed).

type mcpCallerKey struct{}

// mcpCaller is what the per-request server factory and the tools know of the
// caller: its tenant, whether its key may change things, and the request
// (for the URLs of exposed ports).
type mcpCaller struct {
	tenant string
	write  bool
	r      *http.Request
}

// mcp hands the request to the MCP handler with the caller.
func (s *Server) mcp(w http.ResponseWriter, r *http.Request, c *call) error {
	s.mcpOnce.Do(func() {
		s.mcpHandler = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
			cl, _ := r.Context().Value(mcpCallerKey{}).(mcpCaller)
			return s.mcpServer(cl.tenant, cl.write)
		}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	})
	cl := mcpCaller{tenant: c.tenant, write: c.key.Has(write), r: r}
	if sw, ok := w.(*httpx.StatusWriter); ok && cl.write {
		// The route's scope is read (a read-only key lists and looks), so
		// the middleware does not audit it: a write key's calls are, as
		// every call that may change something.
		defer s.record(r, Route{Method: "POST", Path: "/v1/mcp", Scope: write}, c, w.Header().Get("X-Request-Id"), sw, nil)
	}
	s.mcpHandler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mcpCallerKey{}, cl)))
	return nil
}

// mcpNotAllowed answers the methods other than POST on /v1/mcp: the server
// is stateless, so it has no standalone SSE stream (GET) and no session to
// end (DELETE). It needs no key: the answer is the same for everyone.
func mcpNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", "POST")
	writeJSON(w, http.StatusMethodNotAllowed, api.Error{Error: api.ErrorBody{Kind: errdefs.Kind(errdefs.ErrInvalidArgument),
		Message: r.Method + " /v1/mcp: this MCP server is stateless (no SSE stream, no session); send JSON-RPC messages with POST"}})
}

// mcpServer returns the MCP server of tenant for a key that may (write) or
// may not change things (made once per tenant and kind). Both list every
// tool; on the read-only one the tools that change things refuse.
func (s *Server) mcpServer(tenant string, write bool) *mcp.Server {
	k := tenant + "\x00r"
	if write {
		k = tenant + "\x00w"
	}
	if v, ok := s.mcpServers.Load(k); ok {
		return v.(*mcp.Server)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "amber", Version: s.version}, nil)
	addMCPTools(srv, mcpTools{s: s, eng: s.eng, tenant: tenant, write: write})
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
		Template string    `json:"template" jsonschema:"the template, e.g. python or minimal"`
		Limits   mcpLimits `json:"limits,omitempty" jsonschema:"resource limits; omitted ones take the daemon's defaults"`
		Env      []string  `json:"env,omitempty" jsonschema:"entries of the form KEY=VALUE, added to every process of the sandbox"`
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
		ID       string `json:"id"`
		Template string `json:"template"`
		State    string `json:"state"`
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
	sb, err := t.eng.Create(ctx, engine.CreateRequest{Tenant: t.tenant, Template: in.Template, Limits: l, Env: in.Env})
	return nil, mcpSandboxOut{Sandbox: sb.ID}, err
}

func (t mcpTools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, mcpListOut, error) {
	rows, err := t.eng.List(ctx, t.tenant)
	out := mcpListOut{Sandboxes: []mcpSandbox{}}
	for _, sb := range rows {
		out.Sandboxes = append(out.Sandboxes, mcpSandbox{ID: sb.ID, Template: sb.Template, State: string(sb.State)})
	}
	return nil, out, err
}

func (t mcpTools) exec(ctx context.Context, _ *mcp.CallToolRequest, in mcpExecIn) (*mcp.CallToolResult, mcpExecOut, error) {
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
	st, err := t.eng.Exec(ctx, t.tenant, in.Sandbox, sandbox.ExecSpec{Args: in.Command, Stdout: &out, Stderr: &errb, Timeout: to})
	if err != nil {
		return nil, mcpExecOut{}, err
	}
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

func (t mcpTools) checkpoint(ctx context.Context, _ *mcp.CallToolRequest, in mcpCheckpointIn) (*mcp.CallToolResult, mcpCheckpointOut, error) {
	ck, err := t.eng.Checkpoint(ctx, engine.CheckpointRequest{Tenant: t.tenant, Sandbox: in.Sandbox, Tag: in.Tag})
	return nil, mcpCheckpointOut{Checkpoint: ck.ID}, err
}

func (t mcpTools) restore(ctx context.Context, _ *mcp.CallToolRequest, in mcpRestoreIn) (*mcp.CallToolResult, mcpSandboxOut, error) {
	sb, err := t.eng.Restore(ctx, engine.RestoreRequest{Tenant: t.tenant, Checkpoint: in.Checkpoint})
	return nil, mcpSandboxOut{Sandbox: sb.ID}, err
}
