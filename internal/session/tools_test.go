package session

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
)

// hostBoxes runs Exec on the host (for the http tool's script, which needs
// only python3); files go to the fake.
type hostBoxes struct{ *fakeBoxes }

func (h hostBoxes) Exec(ctx context.Context, tenant, id string, r ExecRequest) (ExecResult, error) {
	cmd := exec.CommandContext(ctx, r.Args[0], r.Args[1:]...)
	cmd.Stdin = bytes.NewReader(r.Stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		return ExecResult{}, err
	}
	return ExecResult{Stdout: out.Bytes(), Stderr: errb.Bytes(), Code: code}, nil
}

// TestHTTPToolScript: the http tool's request runs as a Python program (in
// the sandbox, so it leaves through the sandbox's egress); method, headers
// and body reach the server, status and body come back, and an error status
// is a result, not a failure.
func TestHTTPToolScript(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not on the host")
	}
	var got struct {
		method, ctype, body, key string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.method, got.ctype, got.body, got.key = r.Method, r.Header.Get("Content-Type"), string(b), r.Header.Get("Idempotency-Key")
		if r.URL.Path == "/missing" {
			http.Error(w, "no such order", 404)
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"order":"A1","état":"ok"}`)
	}))
	defer srv.Close()
	boxes := hostBoxes{newFakeBoxes()}
	in, _ := json.Marshal(map[string]any{"method": "POST", "url": srv.URL + "/orders", "headers": map[string]string{"Content-Type": "application/json", "Idempotency-Key": "k1"}, "body": `{"item":"tea"}`})
	out, isErr, err := runTool(context.Background(), boxes, "acme", "sbx", ToolCall{ID: "c1", Name: "http", Input: in})
	if err != nil || isErr {
		t.Fatalf("http tool: %q %v %v", out, isErr, err)
	}
	var res struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Status != 201 || res.Body != `{"order":"A1","état":"ok"}` {
		t.Fatalf("answer %q (%v)", out, err)
	}
	if got.method != "POST" || got.ctype != "application/json" || got.body != `{"item":"tea"}` || got.key != "k1" {
		t.Fatalf("server got %+v", got)
	}
	in, _ = json.Marshal(map[string]any{"url": srv.URL + "/missing"})
	out, isErr, err = runTool(context.Background(), boxes, "acme", "sbx", ToolCall{ID: "c2", Name: "http", Input: in})
	if err != nil || isErr || !strings.Contains(out, `"status": 404`) || got.method != "GET" {
		t.Fatalf("404: %q %v %v (method %s)", out, isErr, err, got.method)
	}
	in, _ = json.Marshal(map[string]any{"url": "http://127.0.0.1:1/nothing"})
	out, isErr, err = runTool(context.Background(), boxes, "acme", "sbx", ToolCall{ID: "c3", Name: "http", Input: in})
	if err != nil || !isErr || !strings.Contains(out, "request failed") {
		t.Fatalf("refused connection: %q %v %v", out, isErr, err)
	}
}
