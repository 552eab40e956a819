package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EMCPClients runs the official MCP clients against a real daemon
// over streamable HTTP with a bearer key: the TypeScript SDK's client
// (@modelcontextprotocol/sdk) through a scripted agent session
// (testdata/mcpclients/session.mjs: initialize, tools, exec with progress,
// files, a background process, checkpoint, fork, a cancelled exec whose
// process must be gone from ps, destroy, end of session; any error the SDK
// reports fails it), then the MCP Inspector's CLI
// (@modelcontextprotocol/inspector-cli) listing the tools and calling
// one. The packages, pinned by testdata/mcpclients/package-lock.json, are
// installed by scripts/setup/npm-deps.sh mcp (`make setup-test`) into the
// cache, keyed by the lockfile's hash, and linked into a copy of the
// directory: the source tree is not written to.
func TestE2EMCPClients(t *testing.T) {
	src, _ := filepath.Abs("testdata/mcpclients")
	node, deps := npmDeps(t, src, "mcp", "@modelcontextprotocol/sdk/package.json", "setup-mcp-deps")
	work := t.TempDir()
	for _, f := range []string{"package.json", "session.mjs"} {
		if out, err := exec.Command("cp", filepath.Join(src, f), work).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", f, err, out)
		}
	}
	if err := os.Symlink(deps, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}

	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr + "/v1/mcp"
	run := func(what string, args ...string) string {
		t.Helper()
		cmd := exec.Command(node, args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "AMBER_MCP_URL="+url, "AMBER_TOKEN="+strings.TrimSpace(string(key)),
			"NO_COLOR=1", "MCP_CATALOG_PATH="+filepath.Join(work, "catalog.json"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s\ndaemon log:\n%s", what, err, out, tail(d.log(), 30))
		}
		return string(out)
	}
	out := run("the TypeScript SDK's session", "session.mjs")
	t.Logf("%s", out)
	if !strings.HasSuffix(strings.TrimSpace(out), "all ok") {
		t.Fatalf("the session script did not finish:\n%s", out)
	}

	// The Inspector's CLI: tools/list with its --strict check of every
	// tool's schemas (a finding is a warning on stderr), and a call. Its
	// catalog of servers goes to the test's directory, not $HOME.
	inspector := []string{filepath.Join("node_modules", "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js"),
		"--cli", url, "--transport", "http", "--header", "Authorization: Bearer " + strings.TrimSpace(string(key))}
	out = run("inspector tools/list", append(inspector, "--method", "tools/list", "--strict")...)
	if !strings.Contains(out, `"sandbox_create"`) || !strings.Contains(out, `"readOnlyHint"`) || strings.Contains(out, "Warning") {
		t.Fatalf("inspector tools/list --strict:\n%s", out)
	}
	out = run("inspector tools/call", append(inspector, "--method", "tools/call", "--tool-name", "sandbox_list")...)
	if !strings.Contains(out, `"sandboxes"`) || strings.Contains(out, `"isError"`) {
		t.Fatalf("inspector tools/call sandbox_list:\n%s", out)
	}
	// A sandbox made, used and destroyed by the Inspector's calls.
	call := func(tool string, args ...string) map[string]any {
		t.Helper()
		out := run("inspector "+tool, append(append(inspector, "--method", "tools/call", "--tool-name", tool), append([]string{"--tool-arg"}, args...)...)...)
		var res struct {
			StructuredContent map[string]any `json:"structuredContent"`
			IsError           bool           `json:"isError"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.IsError {
			t.Fatalf("inspector tools/call %s: %v\n%s", tool, err, out)
		}
		return res.StructuredContent
	}
	sb, _ := call("sandbox_create", "template=minimal")["sandbox"].(string)
	if ex := call("exec", "sandbox="+sb, `command=["sh","-c","echo from-inspector"]`); ex["stdout"] != "from-inspector\n" {
		t.Fatalf("inspector exec: %v", ex)
	}
	if d := call("sandbox_destroy", "sandbox="+sb); d["done"] != true {
		t.Fatalf("inspector sandbox_destroy: %v", d)
	}
}
