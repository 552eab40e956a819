package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
)

// MCP: POST /v1/mcp serves the caller's tenant's sandboxes as Model Context
// Protocol tools (streamable HTTP, stateless), so any MCP client can drive
// an Amber sandbox with its API key. Every request is authenticated and
// authorized like any other call (scope write: the tools change things) and
// audited; stateless means no MCP session outlives a request, so none can
// be carried to another tenant. The tools call the engine as the API does:
// another tenant's sandbox is not found.

type mcpTenantKey struct{}

// mcp hands the request to the MCP handler with the caller's tenant.
func (s *Server) mcp(w http.ResponseWriter, r *http.Request, c *call) error {
	s.mcpOnce.Do(func() {
		s.mcpHandler = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
			tenant, _ := r.Context().Value(mcpTenantKey{}).(string)
			return s.mcpServer(tenant)
		}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	})
	s.mcpHandler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mcpTenantKey{}, c.tenant)))
	return nil
}

// mcpServer returns tenant's MCP server (made once per tenant).
func (s *Server) mcpServer(tenant string) *mcp.Server {
	if v, ok := s.mcpServers.Load(tenant); ok {
		return v.(*mcp.Server)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "amber", Version: s.version}, nil)
	t := mcpTools{eng: s.eng, tenant: tenant}
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_create", Description: "Create a sandbox from a template (e.g. python, minimal); returns its id."}, t.create)
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_list", Description: "List your sandboxes."}, t.list)
	mcp.AddTool(srv, &mcp.Tool{Name: "exec", Description: "Run a command in a sandbox; returns its exit code, stdout and stderr."}, t.exec)
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: "Read a file of a sandbox."}, t.readFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Write a file in a sandbox."}, t.writeFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "checkpoint", Description: "Checkpoint a sandbox (memory, processes, files); returns the checkpoint id."}, t.checkpoint)
	mcp.AddTool(srv, &mcp.Tool{Name: "restore", Description: "Restore a sandbox in place from one of its checkpoints."}, t.restore)
	v, _ := s.mcpServers.LoadOrStore(tenant, srv)
	return v.(*mcp.Server)
}

type mcpTools struct {
	eng    *engine.Engine
	tenant string
}

// mcpMaxOutput bounds what a tool returns of a command's output or a file.
const mcpMaxOutput = 1 << 20

type (
	mcpCreateIn struct {
		Template string `json:"template" jsonschema:"the template, e.g. python or minimal"`
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
		Path    string `json:"path"`
	}
	mcpContentOut struct {
		Content string `json:"content"`
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
	sb, err := t.eng.Create(ctx, engine.CreateRequest{Tenant: t.tenant, Template: in.Template})
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

func (t mcpTools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in mcpPathIn) (*mcp.CallToolResult, mcpContentOut, error) {
	fs, err := t.eng.Files(ctx, t.tenant, in.Sandbox)
	if err != nil {
		return nil, mcpContentOut{}, err
	}
	var b capped
	if err := fs.ReadFile(ctx, in.Path, &b); err != nil {
		return nil, mcpContentOut{}, err
	}
	return nil, mcpContentOut{Content: b.String()}, nil
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

// capped keeps the first mcpMaxOutput bytes written and counts the rest.
type capped struct {
	bytes.Buffer
	dropped int
}

func (c *capped) Write(p []byte) (int, error) {
	room := mcpMaxOutput - c.Len()
	if room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	c.dropped += max(0, len(p)-max(room, 0))
	return len(p), nil
}

func (c *capped) String() string {
	if c.dropped > 0 {
		return c.Buffer.String() + fmt.Sprintf("\n[%d bytes cut]", c.dropped)
	}
	return c.Buffer.String()
}
