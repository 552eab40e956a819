package server_test

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/session"
)

// The OpenAPI document checked field by field against the Go types the
// handlers decode and encode (package api): for every operation, each JSON
// request body and each 2xx JSON, NDJSON or SSE response has the Go type
// bodyTypes names, and its schema lists exactly that type's JSON fields,
// with compatible types, recursively. Required-ness: a field the Go type
// marks omitempty is never required; in what the server sends, every other
// field is (encoding/json always writes it). A body the document describes
// and the table does not name, or the other way round, fails too.

// dir says which way a body goes: what the server sends must list every
// field it always writes as required.
type dir int

const (
	request dir = iota
	response
)

func typ[T any]() reflect.Type { return reflect.TypeFor[T]() }

// bodyTypes maps "METHOD path" to its bodies: "request" and "STATUS
// content-type" (the types of a oneOf's members, in its order).
var bodyTypes = map[string]map[string][]reflect.Type{
	"GET /healthz":      {"200 application/json": {typ[map[string]string]()}},
	"GET /readyz":       {"200 application/json": {typ[map[string]string]()}},
	"GET /v1/info":      {"200 application/json": {typ[api.Info]()}},
	"GET /v1/templates": {"200 application/json": {typ[api.TemplateList]()}},
	"POST /v1/sandboxes": {"request": {typ[api.CreateSandboxRequest]()},
		"201 application/json": {typ[api.Sandbox]()}},
	"GET /v1/sandboxes":      {"200 application/json": {typ[api.SandboxList]()}},
	"GET /v1/sandboxes/{id}": {"200 application/json": {typ[api.Sandbox]()}},
	"POST /v1/sandboxes/{id}/timeout": {"request": {typ[api.SetTimeoutRequest]()},
		"200 application/json": {typ[api.Sandbox]()}},
	"POST /v1/sandboxes/{id}/kill":     {"200 application/json": {typ[api.Sandbox]()}},
	"POST /v1/sandboxes/{id}/exec":     {"request": {typ[api.ExecRequest]()}, "200 application/x-ndjson": {typ[api.ExecFrame]()}},
	"GET /v1/sandboxes/{id}/processes": {"200 application/json": {typ[api.ProcessList]()}},
	"POST /v1/sandboxes/{id}/processes": {"request": {typ[api.StartProcessRequest]()},
		"201 application/json": {typ[api.StartProcessResponse]()}},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal": {"request": {typ[api.SignalRequest]()}},
	"POST /v1/sandboxes/{id}/processes/{pid}/wait":   {"200 application/json": {typ[api.ExitStatus]()}},
	"GET /v1/sandboxes/{id}/processes/{pid}/output":  {"200 application/x-ndjson": {typ[api.OutputFrame]()}},
	"GET /v1/sandboxes/{id}/files":                   {"200 application/json": {typ[api.FileList](), typ[api.FileInfo]()}},
	"POST /v1/sandboxes/{id}/files/rename":           {"request": {typ[api.RenameRequest]()}},
	"GET /v1/sandboxes/{id}/files/watch":             {"200 application/x-ndjson": {typ[api.WatchEvent]()}},
	"GET /v1/sandboxes/{id}/events": {"200 application/json": {typ[api.EventList]()},
		"200 application/x-ndjson": {typ[api.Event](), typ[api.Error]()}},
	"POST /v1/sandboxes/{id}/ports": {"request": {typ[api.ExposePortRequest]()},
		"201 application/json": {typ[api.PortExposure]()}},
	"GET /v1/sandboxes/{id}/ports": {"200 application/json": {typ[api.PortList]()}},
	"POST /v1/sandboxes/{id}/checkpoints": {"request": {typ[api.CreateCheckpointRequest]()},
		"201 application/json": {typ[api.Checkpoint]()}, "201 application/x-ndjson": {typ[api.OperationFrame]()},
		"200 application/x-ndjson": {typ[api.OperationFrame]()}},
	"GET /v1/sandboxes/{id}/checkpoints": {"200 application/json": {typ[api.CheckpointList]()}},
	"POST /v1/sandboxes/{id}/recover": {"request": {typ[api.RecoverRequest]()},
		"200 application/json": {typ[api.Sandbox]()}, "200 application/x-ndjson": {typ[api.OperationFrame]()}},
	"GET /v1/checkpoints/{id}": {"200 application/json": {typ[api.Checkpoint]()}},
	"POST /v1/checkpoints/{id}/restore": {"request": {typ[api.RestoreRequest]()},
		"200 application/json": {typ[api.Sandbox]()}, "200 application/x-ndjson": {typ[api.OperationFrame]()},
		"201 application/json": {typ[api.Sandbox]()}, "201 application/x-ndjson": {typ[api.OperationFrame]()}},
	"POST /v1/tenants": {"request": {typ[api.CreateTenantRequest]()}, "201 application/json": {typ[api.Tenant]()}},
	"GET /v1/tenants":  {"200 application/json": {typ[api.TenantList]()}},
	"POST /v1/tenants/{tenant}/keys": {"request": {typ[api.CreateKeyRequest]()},
		"201 application/json": {typ[api.APIKey]()}},
	"GET /v1/tenants/{tenant}/keys":   {"200 application/json": {typ[api.APIKeyList]()}},
	"GET /v1/tenants/{tenant}/policy": {"200 application/json": {typ[api.TenantPolicy]()}},
	"PUT /v1/tenants/{tenant}/policy": {"request": {typ[api.TenantPolicy]()},
		"200 application/json": {typ[api.TenantPolicy]()}},
	"GET /v1/audit":                  {"200 application/json": {typ[api.AuditList]()}},
	"GET /v1/audit/verify":           {"200 application/json": {typ[api.AuditReport]()}},
	"GET /v1/tenants/{tenant}/quota": {"200 application/json": {typ[api.TenantQuota]()}},
	"PUT /v1/tenants/{tenant}/quota": {"request": {typ[api.TenantQuota]()},
		"200 application/json": {typ[api.TenantQuota]()}},
	"GET /v1/sandboxes/{id}/egress": {"200 application/json": {typ[api.SandboxEgress]()}},
	"PUT /v1/sandboxes/{id}/egress": {"request": {typ[*api.EgressPolicy]()},
		"200 application/json": {typ[api.SandboxEgress]()}},
	"GET /v1/sandboxes/{id}/effects":   {"200 application/json": {typ[api.EffectList]()}},
	"GET /v1/tenants/{tenant}/secrets": {"200 application/json": {typ[api.SecretList]()}},
	"PUT /v1/tenants/{tenant}/secrets/{name}": {"request": {typ[api.PutSecretRequest]()},
		"200 application/json": {typ[api.Secret]()}},
	"POST /v1/sessions": {"request": {typ[session.Definition]()},
		"201 application/json": {typ[api.Session]()}},
	"GET /v1/sessions":      {"200 application/json": {typ[api.SessionList]()}},
	"GET /v1/sessions/{id}": {"200 application/json": {typ[api.Session]()}},
	"POST /v1/sessions/{id}/events": {"request": {typ[api.PostSessionEventRequest]()},
		"201 application/json": {typ[api.Event]()}},
	"GET /v1/sessions/{id}/events":        {"200 application/json": {typ[api.EventList]()}},
	"GET /v1/sessions/{id}/events/stream": {"200 text/event-stream": {typ[api.Event](), typ[api.AssistantDelta](), typ[api.Error]()}},
	"GET /v1/templates/{ref}":             {"200 application/json": {typ[api.TemplateVersion]()}},
	"POST /v1/templates/{name}/import": {"200 application/json": {typ[api.ImportTemplateResult]()},
		"201 application/json": {typ[api.ImportTemplateResult]()}},
	"PUT /v1/templates/{name}/tag": {"request": {typ[api.TagTemplateRequest]()},
		"200 application/json": {typ[api.TemplateVersion]()}},
	"POST /v1/templates/gc": {"200 application/json": {typ[api.GCTemplatesResult]()}},
	"POST /v1/sandboxes/{id}/upgrade": {"request": {typ[api.UpgradeSandboxRequest]()},
		"201 application/json": {typ[api.Sandbox]()}},
	// MCP's body is JSON-RPC, described by the MCP specification.
	"POST /v1/mcp": {"request": {typ[any]()}, "200 application/json": {typ[any]()}},
	// The document itself.
	"GET /v1/openapi.json": {"200 application/json": {typ[any]()}},
	"GET /v1/usage":        {"200 application/json": {typ[api.UsageReport]()}},
	"POST /v1/sandboxes/{id}/effects/reconcile": {"request": {typ[api.ReconcileRequest]()},
		"200 application/json": {typ[api.Effect]()}},
	"GET /v1/sandboxes/{id}/stats":     {"200 application/json": {typ[api.SandboxStats]()}},
	"POST /v1/sandboxes/{id}/terminal": {"201 application/json": {typ[api.TerminalTicket]()}},
	"GET /v1/nodes":                    {"200 application/json": {typ[api.NodeList]()}},
	"POST /v1/nodes/{id}/drain": {"200 application/json": {typ[api.DrainFrame]()},
		"200 application/x-ndjson": {typ[api.DrainFrame]()}},
	"POST /v1/nodes/{id}/undrain": {"200 application/json": {typ[api.Node]()}},
}

// jsonMedia says whether content of this media type is JSON the table must
// name a Go type for.
func jsonMedia(ct string) bool {
	return ct == "application/json" || ct == "application/x-ndjson" || ct == "text/event-stream"
}

func TestOpenAPIFieldsMatchGoTypes(t *testing.T) {
	doc := loadOpenAPI(t, false)
	seen := map[string]bool{}
	// One comparer for all: a component drifting is told once, at the
	// first body that uses it.
	c := &comparer{done: map[string]bool{}}
	for p, item := range doc.Paths.Map() {
		for m, op := range item.Operations() {
			key := m + " " + p
			types := bodyTypes[key]
			check := func(body string, s *openapi3.SchemaRef, d dir) {
				seen[key+" "+body] = true
				ts, ok := types[body]
				if !ok {
					t.Errorf("%s: the document has a %s body; bodyTypes names no Go type for it", key, body)
					return
				}
				for _, e := range c.body(s, ts, d) {
					t.Errorf("%s %s: %s", key, body, e)
				}
			}
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				for ct, mt := range op.RequestBody.Value.Content {
					if jsonMedia(ct) {
						check("request", mt.Schema, request)
					}
				}
			}
			for code, r := range op.Responses.Map() {
				for ct, mt := range r.Value.Content {
					switch {
					case !jsonMedia(ct):
					case code == "4XX" || code == "default":
						// Every error is an api.Error.
						for _, e := range c.body(mt.Schema, []reflect.Type{typ[api.Error]()}, response) {
							t.Errorf("%s %s %s: %s", key, code, ct, e)
						}
					default:
						check(code+" "+ct, mt.Schema, response)
					}
				}
			}
		}
	}
	for key, bodies := range bodyTypes {
		for body := range bodies {
			if !seen[key+" "+body] {
				t.Errorf("bodyTypes names a Go type for %s %s, which the document does not describe", key, body)
			}
		}
	}
}

// body compares a body's schema with its Go types (one type, or the
// members of a oneOf) and returns what it found wrong.
func (c *comparer) body(s *openapi3.SchemaRef, ts []reflect.Type, d dir) []string {
	c.errs = nil
	if len(ts) == 1 {
		c.compare(s, ts[0], "body", d)
		return c.errs
	}
	if s == nil || s.Value == nil || len(s.Value.OneOf) != len(ts) {
		return []string{fmt.Sprintf("want a oneOf of %d members (%v)", len(ts), ts)}
	}
	for i, m := range s.Value.OneOf {
		c.compare(m, ts[i], fmt.Sprintf("oneOf[%d]", i), d)
	}
	return c.errs
}

type comparer struct {
	errs []string
	done map[string]bool // component×type×dir already compared (recursion)
}

func (c *comparer) errorf(at, f string, a ...any) {
	c.errs = append(c.errs, at+": "+fmt.Sprintf(f, a...))
}

var (
	timeType      = typ[time.Time]()
	rawType       = typ[json.RawMessage]()
	textMarshaler = typ[encoding.TextMarshaler]()
)

// compare checks that schema s describes what encoding/json makes of t.
func (c *comparer) compare(s *openapi3.SchemaRef, t reflect.Type, at string, d dir) {
	if s == nil || s.Value == nil {
		c.errorf(at, "no schema for Go %v", t)
		return
	}
	if s.Ref != "" {
		k := fmt.Sprint(s.Ref, t, d)
		if c.done[k] {
			return
		}
		c.done[k] = true
		at += " (" + s.Ref[strings.LastIndex(s.Ref, "/")+1:] + ")"
	}
	v := s.Value
	// A nullable wrapper of one $ref (allOf: [X], nullable) is X.
	if len(v.AllOf) == 1 && len(v.Properties) == 0 {
		c.compare(v.AllOf[0], t, at, d)
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawType || t.Kind() == reflect.Interface {
		return // any JSON value
	}
	want := ""
	switch {
	case t == timeType:
		want = "string"
		if v.Format != "date-time" {
			c.errorf(at, "Go time.Time: want format date-time, have %q", v.Format)
		}
	case reflect.PointerTo(t).Implements(textMarshaler) || t.Implements(textMarshaler):
		want = "string"
	case t.Kind() == reflect.String:
		want = "string"
	case t.Kind() == reflect.Bool:
		want = "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		want = "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		want = "number"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		want = "string"
		if v.Format != "byte" {
			c.errorf(at, "Go []byte (base64): want format byte, have %q", v.Format)
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		want = "array"
		c.compare(v.Items, t.Elem(), at+"[]", d)
	case t.Kind() == reflect.Map:
		want = "object"
		if v.AdditionalProperties.Schema == nil {
			c.errorf(at, "Go %v: want additionalProperties with the values' schema", t)
		} else {
			c.compare(v.AdditionalProperties.Schema, t.Elem(), at+"{}", d)
		}
	case t.Kind() == reflect.Struct:
		want = "object"
		c.compareStruct(v, t, at, d)
	default:
		c.errorf(at, "Go %v: no rule for this kind", t)
		return
	}
	if !v.Type.Is(want) {
		c.errorf(at, "Go %v is a JSON %s; the document says %v", t, want, v.Type.Slice())
	}
}

// field is one JSON member of a Go struct.
type field struct {
	t         reflect.Type
	omitEmpty bool
}

// jsonFields lists the members encoding/json writes for t, embedded
// structs' included.
func jsonFields(t reflect.Type) map[string]field {
	out := map[string]field{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = field{t: f.Type, omitEmpty: slices.Contains(strings.Split(opts, ","), "omitempty") ||
			slices.Contains(strings.Split(opts, ","), "omitzero")}
	}
	return out
}

func (c *comparer) compareStruct(v *openapi3.Schema, t reflect.Type, at string, d dir) {
	fields := jsonFields(t)
	var names []string
	for n := range fields {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := fields[n]
		p, ok := v.Properties[n]
		if !ok {
			c.errorf(at, "Go %v has field %q; the document does not list it", t, n)
			continue
		}
		c.compare(p, f.t, at+"."+n, d)
		req := slices.Contains(v.Required, n)
		switch {
		case req && f.omitEmpty:
			c.errorf(at, "%q is required, but Go %v omits it when empty", n, t)
		case !req && !f.omitEmpty && d == response:
			c.errorf(at, "%q is always sent (Go %v has no omitempty) but not required", n, t)
		}
		if f.t.Kind() == reflect.Pointer && !f.omitEmpty && !p.Value.Nullable && d == response {
			c.errorf(at, "%q is a Go pointer without omitempty (sent as null when nil) but not nullable", n)
		}
	}
	for n := range v.Properties {
		if _, ok := fields[n]; !ok {
			c.errorf(at, "the document lists %q; Go %v has no such field", n, t)
		}
	}
	for _, n := range v.Required {
		if _, ok := v.Properties[n]; !ok {
			c.errorf(at, "%q is required but not a property", n)
		}
	}
}

// TestOpenAPIOneOfDiscriminates checks every oneOf of the document as it
// is (not closed by loadOpenAPI's strict mode): a value of each member's
// Go type matches that member and no other, so validators and generated
// clients can tell them apart (a directory listing is a FileList, not also
// a FileInfo). A oneOf or anyOf anywhere but a body bodyTypes describes
// fails: it would be checked by nothing.
func TestOpenAPIOneOfDiscriminates(t *testing.T) {
	doc := loadOpenAPI(t, false)
	fi := api.FileInfo{Name: "a.txt", Type: "file", Size: 3, Mode: "0644", ModTime: time.Now().UTC()}
	samples := map[reflect.Type]any{
		typ[api.FileInfo](): fi,
		typ[api.FileList](): api.FileList{Path: "/work", Entries: []api.FileInfo{fi}},
		typ[api.Event](): api.Event{Seq: 3, ID: "evt-1", Type: "sandbox.created", Version: 1, Time: time.Now().UTC(),
			Payload: json.RawMessage(`{"text":"x","error":{"kind":"internal","message":"m"}}`)},
		typ[api.Error]():          api.Error{Error: api.ErrorBody{Kind: "unavailable", Message: "the stream broke"}},
		typ[api.AssistantDelta](): api.AssistantDelta{Text: "hel"},
	}
	var raw any
	if err := json.Unmarshal(api.OpenAPI, &raw); err != nil {
		t.Fatal(err)
	}
	var unions []string
	walkJSON(raw, "", func(ptr string, m map[string]any) {
		for _, k := range []string{"oneOf", "anyOf"} {
			if _, ok := m[k]; ok {
				unions = append(unions, ptr+"/"+k)
			}
		}
	})
	checked := 0
	for key, bodies := range bodyTypes {
		method, p, _ := strings.Cut(key, " ")
		for body, ts := range bodies {
			if len(ts) < 2 {
				continue
			}
			status, ct, _ := strings.Cut(body, " ")
			ref := doc.Paths.Value(p).GetOperation(method).Responses.Status(atoi(t, status)).Value.Content[ct].Schema
			ptr := "/paths/" + strings.ReplaceAll(p, "/", "~1") + "/" + strings.ToLower(method) + "/responses/" + status + "/content/" + strings.ReplaceAll(ct, "/", "~1") + "/schema/oneOf"
			if ref.Ref != "" {
				ptr = strings.TrimPrefix(ref.Ref, "#") + "/oneOf"
			}
			unions = slices.DeleteFunc(unions, func(u string) bool { return u == ptr })
			s := ref.Value
			for i, mt := range ts {
				sample, ok := samples[mt]
				if !ok {
					t.Errorf("%s %s: no sample value of %v", key, body, mt)
					continue
				}
				var v any
				b, _ := json.Marshal(sample)
				_ = json.Unmarshal(b, &v)
				var matched []int
				for j, m := range s.OneOf {
					if m.Value.VisitJSON(v) == nil {
						matched = append(matched, j)
					}
				}
				if !slices.Equal(matched, []int{i}) {
					t.Errorf("%s %s: a %v (%s) matches members %v of the oneOf; want only %d", key, body, mt, b, matched, i)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Error("no oneOf checked")
	}
	for _, u := range unions {
		t.Errorf("%s: a union no test checks (add its body and member types to bodyTypes)", u)
	}
}

// walkJSON calls f with every object of v and its JSON pointer.
func walkJSON(v any, ptr string, f func(string, map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		f(ptr, v)
		for k, e := range v {
			walkJSON(e, ptr+"/"+strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1"), f)
		}
	case []any:
		for i, e := range v {
			walkJSON(e, fmt.Sprintf("%s/%d", ptr, i), f)
		}
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("status %q: %v", s, err)
	}
	return n
}

// TestOpenAPIStreamsDescribed: every NDJSON or SSE response names the
// schema of one line (a component, with a description) and says how it
// is framed, so generated clients and their users can read it.
func TestOpenAPIStreamsDescribed(t *testing.T) {
	doc := loadOpenAPI(t, false)
	n := 0
	for p, item := range doc.Paths.Map() {
		for m, op := range item.Operations() {
			for code, r := range op.Responses.Map() {
				for ct, mt := range r.Value.Content {
					if ct != "application/x-ndjson" && ct != "text/event-stream" {
						continue
					}
					n++
					at := m + " " + p + " " + code + " " + ct
					if mt.Schema == nil || mt.Schema.Ref == "" {
						t.Errorf("%s: the line's schema is not a named component", at)
					} else if mt.Schema.Value.Description == "" {
						t.Errorf("%s: %s has no description", at, mt.Schema.Ref)
					}
					if d := r.Value.Description; d == nil || (ct == "application/x-ndjson" && !strings.Contains(*d, "newline-delimited JSON")) ||
						(ct == "text/event-stream" && !strings.Contains(*d, "text/event-stream")) {
						t.Errorf("%s: the response's description does not say how the stream is framed", at)
					}
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d streams in the document", n)
	}
}

// TestOpenAPIFieldCheckBites: the field check finds a missing, an extra,
// a mistyped and an unrequired field.
func TestOpenAPIFieldCheckBites(t *testing.T) {
	for name, mutate := range map[string]func(s *openapi3.Schema){
		"missing":  func(s *openapi3.Schema) { delete(s.Properties, "template") },
		"extra":    func(s *openapi3.Schema) { s.Properties["ghost"] = openapi3.NewStringSchema().NewRef() },
		"mistyped": func(s *openapi3.Schema) { s.Properties["state"] = openapi3.NewIntegerSchema().NewRef() },
		"unrequired": func(s *openapi3.Schema) {
			s.Required = slices.DeleteFunc(s.Required, func(n string) bool { return n == "created" })
		},
		"required omitempty": func(s *openapi3.Schema) {
			s.Required = append(s.Required, "env")
		},
	} {
		doc := loadOpenAPI(t, false)
		sref := doc.Components.Schemas["Sandbox"]
		if _, ok := sref.Value.Properties["env"]; !ok && name == "required omitempty" {
			t.Fatalf("Sandbox has no env property to mutate")
		}
		before := (&comparer{done: map[string]bool{}}).body(sref, []reflect.Type{typ[api.Sandbox]()}, response)
		if len(before) != 0 {
			t.Fatalf("Sandbox drifts already: %v", before)
		}
		mutate(sref.Value)
		if errs := (&comparer{done: map[string]bool{}}).body(sref, []reflect.Type{typ[api.Sandbox]()}, response); len(errs) == 0 {
			t.Errorf("%s: a drifted Sandbox schema passed", name)
		}
	}
}
