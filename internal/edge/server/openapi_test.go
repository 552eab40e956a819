package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/edge/server"
)

// The OpenAPI document (api/openapi.json) is checked by kin-openapi: it
// must be a valid OpenAPI 3 document, describe exactly the routes the
// server registers with the scope each needs, and the server's real
// requests and responses must validate against its schemas.

// loadOpenAPI loads and validates the document. Every object schema that
// does not say otherwise is made closed (additionalProperties: false), so
// a field the server sends but the document does not name fails the
// response checks below.
func loadOpenAPI(t *testing.T, strict bool) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("api/openapi.json does not load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.json is not a valid OpenAPI document: %v", err)
	}
	if strict {
		for _, s := range doc.Components.Schemas {
			if s.Value.Type.Is("object") && s.Value.AdditionalProperties.Has == nil && s.Value.AdditionalProperties.Schema == nil {
				s.Value.AdditionalProperties.Has = openapi3.Ptr(false)
			}
		}
	}
	return doc
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc := loadOpenAPI(t, false)
	routed := map[string]bool{}
	for _, rt := range (&server.Server{}).Routes() {
		routed[rt.Method+" "+rt.Path] = true
		item := doc.Paths.Value(rt.Path)
		if item == nil || item.GetOperation(rt.Method) == nil {
			t.Errorf("route %s %s is not in api/openapi.json", rt.Method, rt.Path)
			continue
		}
		op := item.GetOperation(rt.Method)
		if op.Extensions["x-amber-scope"] != string(rt.Scope) {
			t.Errorf("api/openapi.json says %s %s needs scope %v; routes() says %q", rt.Method, rt.Path, op.Extensions["x-amber-scope"], rt.Scope)
		}
		if op.Responses.Default() == nil {
			t.Errorf("%s %s: no default (error) response in api/openapi.json", rt.Method, rt.Path)
		}
	}
	for p, item := range doc.Paths.Map() {
		for m := range item.Operations() {
			if !routed[m+" "+p] {
				t.Errorf("api/openapi.json describes %s %s, which is not routed", m, p)
			}
		}
	}
}

var ndjsonOnce sync.Once

// conformance sends real requests to a server and checks each request and
// its response against the document.
type conformance struct {
	t    *testing.T
	doc  *openapi3.T
	base string
	key  string
}

// call sends method path (pattern is its route in the document) with body
// as JSON, checks the request and the answer against the document and
// decodes the answer into out (ndjson: the last frame). It returns the status.
func (c conformance) call(method, pattern, path string, params map[string]string, body any, out any) int {
	t := c.t
	t.Helper()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	item := c.doc.Paths.Value(pattern)
	if item == nil || item.GetOperation(method) == nil {
		t.Fatalf("%s %s is not in the document", method, pattern)
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params,
		Route:   &routers.Route{Spec: c.doc, Path: pattern, PathItem: item, Method: method, Operation: item.GetOperation(method)},
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		t.Errorf("request %s %s does not match the document: %v", method, path, err)
	}
	req.Body = io.NopCloser(bytes.NewReader(raw)) // validation read it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode < 400 && item.GetOperation(method).Responses.Status(resp.StatusCode) == nil {
		t.Errorf("%s %s answered %d, which the document does not list", method, pattern, resp.StatusCode)
	}
	// An ndjson stream is checked frame by frame against the schema of
	// its content type.
	bodies := [][]byte{b}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		bodies = nil
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			bodies = append(bodies, append([]byte(nil), sc.Bytes()...))
		}
	}
	for _, fr := range bodies {
		rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Options: &openapi3filter.Options{MultiError: true}}
		rin.SetBodyBytes(fr)
		if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
			t.Errorf("response %d of %s %s does not match the document: %v\n%s", resp.StatusCode, method, path, err, fr)
		}
	}
	if out != nil && len(bodies) > 0 {
		if err := json.Unmarshal(bodies[len(bodies)-1], out); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

func TestOpenAPIMatchesRealResponses(t *testing.T) {
	ndjsonOnce.Do(func() {
		// Each frame of a stream is one JSON value of the content's schema.
		openapi3filter.RegisterBodyDecoder("application/x-ndjson", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
			var v any
			dec := json.NewDecoder(r)
			dec.UseNumber()
			return v, dec.Decode(&v)
		})
	})
	_, _, base := newAPI(t)
	c := conformance{t: t, doc: loadOpenAPI(t, true), base: base, key: testKey}

	var sb api.Sandbox
	if code := c.call("POST", "/v1/sandboxes", "/v1/sandboxes", nil, api.CreateSandboxRequest{Template: "minimal", Env: []string{"A=1"},
		Metadata: map[string]string{"k": "v"}, Timeout: 3600}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	id := map[string]string{"id": sb.ID}
	c.call("GET", "/v1/sandboxes", "/v1/sandboxes", nil, nil, nil)
	c.call("GET", "/v1/sandboxes", "/v1/sandboxes?state=running&metadata=k=v", nil, nil, nil)
	c.call("POST", "/v1/sandboxes/{id}/timeout", "/v1/sandboxes/"+sb.ID+"/timeout", id, api.SetTimeoutRequest{Timeout: 3600}, nil)
	c.call("GET", "/v1/sandboxes/{id}", "/v1/sandboxes/"+sb.ID, id, nil, nil)
	var exit api.ExecFrame
	if code := c.call("POST", "/v1/sandboxes/{id}/exec", "/v1/sandboxes/"+sb.ID+"/exec", id,
		api.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2; exit 4"}}, &exit); code != 200 || exit.Exit == nil || exit.Exit.Code != 4 {
		t.Errorf("exec: %d, last frame %+v", code, exit)
	}
	c.call("GET", "/v1/info", "/v1/info", nil, nil, nil)
	c.call("GET", "/v1/templates", "/v1/templates", nil, nil, nil)
	c.call("GET", "/v1/sandboxes/{id}/events", "/v1/sandboxes/"+sb.ID+"/events", id, nil, nil)
	var ck api.Checkpoint
	if code := c.call("POST", "/v1/sandboxes/{id}/checkpoints", "/v1/sandboxes/"+sb.ID+"/checkpoints", id, api.CreateCheckpointRequest{Tag: "t1"}, &ck); code != 201 {
		t.Errorf("checkpoint: %d", code)
	}
	c.call("GET", "/v1/sandboxes/{id}/checkpoints", "/v1/sandboxes/"+sb.ID+"/checkpoints", id, nil, nil)
	c.call("GET", "/v1/checkpoints/{id}", "/v1/checkpoints/"+ck.ID, map[string]string{"id": ck.ID}, nil, nil)
	c.call("POST", "/v1/tenants", "/v1/tenants", nil, api.CreateTenantRequest{ID: "acme"}, nil)
	c.call("POST", "/v1/tenants/{tenant}/keys", "/v1/tenants/acme/keys", map[string]string{"tenant": "acme"},
		api.CreateKeyRequest{Name: "ci", Scopes: []string{"read", "write"}}, nil)
	c.call("GET", "/v1/tenants/{tenant}/keys", "/v1/tenants/acme/keys", map[string]string{"tenant": "acme"}, nil, nil)
	c.call("GET", "/v1/audit", "/v1/audit", nil, nil, nil)
	c.call("GET", "/v1/audit/verify", "/v1/audit/verify", nil, nil, nil)
	c.call("GET", "/v1/usage", "/v1/usage?group_by=sandbox&from=2026-01-01", nil, nil, nil)
	c.call("GET", "/v1/tenants", "/v1/tenants", nil, nil, nil)
	c.call("GET", "/v1/tenants/{tenant}/policy", "/v1/tenants/acme/policy", map[string]string{"tenant": "acme"}, nil, nil)
	c.call("PUT", "/v1/tenants/{tenant}/policy", "/v1/tenants/acme/policy", map[string]string{"tenant": "acme"}, api.TenantPolicy{Recovery: "fast", FastEvery: 5}, nil)
	c.call("PUT", "/v1/tenants/{tenant}/quota", "/v1/tenants/acme/quota", map[string]string{"tenant": "acme"}, api.TenantQuota{MaxSandboxes: 3, RequestsPerSecond: 10}, nil)
	c.call("GET", "/v1/tenants/{tenant}/quota", "/v1/tenants/acme/quota", map[string]string{"tenant": "acme"}, nil, nil)
	c.call("GET", "/healthz", "/healthz", nil, nil, nil)
	c.call("GET", "/readyz", "/readyz", nil, nil, nil)

	// Processes, files and ports of the sandbox.
	var started api.StartProcessResponse
	c.call("POST", "/v1/sandboxes/{id}/processes", "/v1/sandboxes/"+sb.ID+"/processes", id, api.StartProcessRequest{Args: []string{"sleep", "30"}}, &started)
	c.call("GET", "/v1/sandboxes/{id}/processes", "/v1/sandboxes/"+sb.ID+"/processes", id, nil, nil)
	pid := map[string]string{"id": sb.ID, "pid": fmt.Sprint(started.PID)}
	c.call("POST", "/v1/sandboxes/{id}/processes/{pid}/signal", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", sb.ID, started.PID), pid, api.SignalRequest{Signal: "TERM"}, nil)
	c.call("POST", "/v1/sandboxes/{id}/processes/{pid}/wait", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/wait", sb.ID, started.PID), pid, nil, nil)
	var echoed api.StartProcessResponse
	c.call("POST", "/v1/sandboxes/{id}/processes", "/v1/sandboxes/"+sb.ID+"/processes", id, api.StartProcessRequest{Args: []string{"sh", "-c", "echo out; echo err >&2"}}, &echoed)
	epid := map[string]string{"id": sb.ID, "pid": fmt.Sprint(echoed.PID)}
	var last api.OutputFrame
	c.call("GET", "/v1/sandboxes/{id}/processes/{pid}/output", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/output?offset=0&follow=true", sb.ID, echoed.PID), epid, nil, &last)
	if last.Stream != "exited" || last.Exit == nil || last.Offset != 8 {
		t.Errorf("the output stream's last frame: %+v, want exited at offset 8", last)
	}
	c.call("POST", "/v1/sandboxes/{id}/files/mkdir", "/v1/sandboxes/"+sb.ID+"/files/mkdir?path=/work", id, nil, nil)
	c.call("GET", "/v1/sandboxes/{id}/files", "/v1/sandboxes/"+sb.ID+"/files?path=/work", id, nil, nil)
	c.call("GET", "/v1/sandboxes/{id}/files", "/v1/sandboxes/"+sb.ID+"/files?path=/work&stat=true", id, nil, nil)
	c.call("POST", "/v1/sandboxes/{id}/files/rename", "/v1/sandboxes/"+sb.ID+"/files/rename", id, api.RenameRequest{From: "/work", To: "/work-renamed"}, nil)
	var exp api.PortExposure
	c.call("POST", "/v1/sandboxes/{id}/ports", "/v1/sandboxes/"+sb.ID+"/ports", id, api.ExposePortRequest{Port: 8080}, &exp)
	c.call("GET", "/v1/sandboxes/{id}/ports", "/v1/sandboxes/"+sb.ID+"/ports", id, nil, nil)
	c.call("DELETE", "/v1/sandboxes/{id}/ports/{port}", "/v1/sandboxes/"+sb.ID+"/ports/8080", map[string]string{"id": sb.ID, "port": "8080"}, nil, nil)

	// Restore (into the sandbox, and as a fork) and recover.
	var fork api.Sandbox
	c.call("POST", "/v1/checkpoints/{id}/restore", "/v1/checkpoints/"+ck.ID+"/restore", map[string]string{"id": ck.ID}, api.RestoreRequest{AsNew: true}, &fork)
	c.call("POST", "/v1/sandboxes/{id}/recover", "/v1/sandboxes/"+sb.ID+"/recover", id, api.RecoverRequest{}, nil)
	c.call("POST", "/v1/sandboxes/{id}/kill", "/v1/sandboxes/"+sb.ID+"/kill", id, nil, nil)
	if fork.ID != "" {
		c.call("DELETE", "/v1/sandboxes/{id}", "/v1/sandboxes/"+fork.ID, map[string]string{"id": fork.ID}, nil, nil)
	}

	// Errors match the error schema too.
	var e api.Error
	if code := c.call("GET", "/v1/sandboxes/{id}", "/v1/sandboxes/sbx-nosuchsandbox00", map[string]string{"id": "sbx-nosuchsandbox00"}, nil, &e); code != 404 || e.Error.Kind != "not found" {
		t.Errorf("unknown sandbox: %d %+v", code, e)
	}
	c.call("DELETE", "/v1/sandboxes/{id}", "/v1/sandboxes/"+sb.ID, id, nil, nil)

	// The checks bite: the created sandbox with one undocumented field, or
	// with its state as a number, is refused.
	good, _ := json.Marshal(sb)
	for _, bad := range []string{
		strings.Replace(string(good), "{", `{"undocumented":1,`, 1),
		strings.Replace(string(good), `"state":"running"`, `"state":7`, 1),
	} {
		if bad == string(good) {
			t.Fatalf("mutation did not apply to %s", good)
		}
		item := c.doc.Paths.Value("/v1/sandboxes")
		req, _ := http.NewRequest("POST", c.base+"/v1/sandboxes", nil)
		rin := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req,
				Route: &routers.Route{Spec: c.doc, Path: "/v1/sandboxes", PathItem: item, Method: "POST", Operation: item.Post}},
			Status: 201, Header: http.Header{"Content-Type": {"application/json"}}}
		rin.SetBodyBytes([]byte(bad))
		if err := openapi3filter.ValidateResponse(context.Background(), rin); err == nil {
			t.Errorf("a sandbox body the document does not allow passed: %s", bad)
		}
	}
}
