package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// newLimited serves a real engine with limits and returns its URL and a
// client.
func newLimited(t *testing.T, l server.Limits) (string, *client.Client) {
	t.Helper()
	env := enginetest.New(t, engine.Options{})
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Limits: l}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, testKey)
	if err != nil {
		t.Fatal(err)
	}
	return ts.URL, c
}

// send does one request and returns the status and the error body.
func sendRaw(t *testing.T, method, url string, body io.Reader, header map[string]string) (int, api.ErrorBody) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e api.Error
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s %s: %d with a body that is not the JSON error: %q", method, url, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, e.Error
}

func wantRefused(t *testing.T, what string, code int, e api.ErrorBody, status int, kind string, mentions ...string) {
	t.Helper()
	if code != status || e.Kind != kind {
		t.Errorf("%s: %d %q (%s), want %d %q", what, code, e.Kind, e.Message, status, kind)
		return
	}
	for _, m := range mentions {
		if !strings.Contains(e.Message, m) {
			t.Errorf("%s: message %q does not mention %q", what, e.Message, m)
		}
	}
}

func TestInputLimits(t *testing.T) {
	base, c := newLimited(t, server.Limits{MaxBodyBytes: 16 << 10, MaxUploadBytes: 64 << 10, MaxArgs: 8, MaxEnv: 4, MaxCommandBytes: 1 << 10, MaxExecsPerSandbox: 1})
	ctx := ctxT(t)
	ctJSON := map[string]string{"Content-Type": "application/json"}

	// A JSON body over the limit, with and without an Idempotency-Key (that
	// path reads the body itself).
	big := `{"template":"minimal","env":["X=` + strings.Repeat("a", 20<<10) + `"]}`
	code, e := sendRaw(t, "POST", base+"/v1/sandboxes", strings.NewReader(big), ctJSON)
	wantRefused(t, "big create body", code, e, 413, "too large", "16 KiB", "max_body_bytes")
	code, e = sendRaw(t, "POST", base+"/v1/sandboxes", strings.NewReader(big), map[string]string{"Content-Type": "application/json", "Idempotency-Key": "k-1"})
	wantRefused(t, "big create body with an idempotency key", code, e, 413, "too large", "max_body_bytes")
	code, e = sendRaw(t, "POST", base+"/v1/tenants", strings.NewReader(`{"id":"a"}{"id":"b"}`), ctJSON)
	wantRefused(t, "two JSON values", code, e, 400, "invalid argument", "more than one JSON value")

	// Too many environment entries for a new sandbox.
	_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Env: []string{"A=1", "B=2", "C=3", "D=4", "E=5"}})
	if err == nil || !strings.Contains(err.Error(), "max_env") {
		t.Errorf("create with 5 env entries: %v", err)
	}

	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	execURL := base + "/v1/sandboxes/" + sb.ID + "/exec"
	args, _ := jsonBody(api.ExecRequest{Args: strings.Fields("echo 1 2 3 4 5 6 7 8")})
	code, e = sendRaw(t, "POST", execURL, args, ctJSON)
	wantRefused(t, "exec with 9 args", code, e, 400, "invalid argument", "9 arguments", "max_args")
	long, _ := jsonBody(api.ExecRequest{Args: []string{"echo", strings.Repeat("x", 2<<10)}})
	code, e = sendRaw(t, "POST", execURL, long, ctJSON)
	wantRefused(t, "exec with 2 KiB of args", code, e, 400, "invalid argument", "max_command_bytes")
	code, e = sendRaw(t, "POST", execURL+"?"+strings.Repeat("arg=a&", 9), strings.NewReader(""), nil)
	wantRefused(t, "streamed exec with 9 args", code, e, 400, "invalid argument", "max_args")
	procs, _ := jsonBody(api.StartProcessRequest{Args: []string{"sleep", "1"}, Env: []string{"A=1", "B=2", "C=3", "D=4", "E=5"}})
	code, e = sendRaw(t, "POST", base+"/v1/sandboxes/"+sb.ID+"/processes", procs, ctJSON)
	wantRefused(t, "process with 5 env entries", code, e, 400, "invalid argument", "max_env")

	// Uploads: exactly the limit is fine; one byte more is refused, whether
	// the length is declared or the body is chunked.
	fileURL := base + "/v1/sandboxes/" + sb.ID + "/files?path=/tmp/f"
	if code, e = sendRaw(t, "PUT", fileURL, bytes.NewReader(make([]byte, 64<<10)), nil); code != 204 {
		t.Fatalf("upload of exactly the limit: %d %+v", code, e)
	}
	code, e = sendRaw(t, "PUT", fileURL, bytes.NewReader(make([]byte, 64<<10+1)), nil)
	wantRefused(t, "declared upload over the limit", code, e, 413, "too large", "64 KiB", "max_upload_bytes")
	code, e = sendRaw(t, "PUT", fileURL, io.MultiReader(strings.NewReader(""), bytes.NewReader(make([]byte, 200<<10))), nil)
	wantRefused(t, "chunked upload over the limit", code, e, 413, "too large", "max_upload_bytes")
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 100 << 10})
	tw.Write(make([]byte, 100<<10))
	tw.Close()
	code, e = sendRaw(t, "PUT", base+"/v1/sandboxes/"+sb.ID+"/files/tar?path=/tmp", io.MultiReader(&tb), nil)
	wantRefused(t, "tar upload over the limit", code, e, 413, "too large", "max_upload_bytes")

	// One exec at a time into this sandbox: the second, while the first
	// streams, is 429 naming the limit; after it ends, exec works again.
	body, _ := jsonBody(api.ExecRequest{Args: []string{"sleep", "2"}})
	req, _ := http.NewRequest("POST", execURL, body)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	first, err := http.DefaultClient.Do(req) // returns at the 200: the slot is held
	if err != nil || first.StatusCode != 200 {
		t.Fatalf("first exec: %v %v", first, err)
	}
	again, _ := jsonBody(api.ExecRequest{Args: []string{"true"}})
	code, e = sendRaw(t, "POST", execURL, again, ctJSON)
	wantRefused(t, "second exec at once", code, e, 429, "resource exhausted", "max_execs_per_sandbox")
	io.Copy(io.Discard, first.Body)
	first.Body.Close()
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Errorf("exec after the first ended: %+v %v", st, err)
	}
}

func jsonBody(v any) (io.Reader, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	return bytes.NewReader(b), nil
}

// TestLimitsOperatorMaximum: the operator's maxima (amber up
// --max-sandbox-*) bound what a create may ask for, each refusal a 400
// naming the maximum; at the maximum is allowed.
func TestLimitsOperatorMaximum(t *testing.T) {
	base, c := newLimited(t, server.Limits{MaxSandbox: sandbox.Limits{MemoryBytes: 256 << 20, MilliCPUs: 500, Pids: 512, DiskBytes: 2 << 30}})
	for _, tc := range []struct{ limits, says string }{
		{`{"memory_bytes":268435457}`, "maximum of 256 MiB"},
		{`{"millicpus":501}`, "maximum of 500m"},
		{`{"pids":513}`, "maximum of 512"},
		{`{"disk_bytes":3221225472}`, "maximum of 2 GiB"},
	} {
		code, e := sendRaw(t, "POST", base+"/v1/sandboxes", strings.NewReader(`{"template":"minimal","limits":`+tc.limits+`}`), map[string]string{"Content-Type": "application/json"})
		if code != 400 || !strings.Contains(e.Message, tc.says) {
			t.Errorf("create with limits %s = %d %q, want 400 saying %q", tc.limits, code, e.Message, tc.says)
		}
	}
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Template: "minimal", Limits: api.Limits{MemoryBytes: 256 << 20, MilliCPUs: 500}})
	if err != nil {
		t.Fatalf("create at the maximum: %v", err)
	}
	c.DeleteSandbox(context.Background(), sb.ID)
}
