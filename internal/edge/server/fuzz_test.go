package server

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
)

// FuzzDecodeRequests feeds arbitrary bytes to the request decoders of the
// main endpoints (create sandbox, exec — JSON body or query parameters —,
// start process, checkpoint, create tenant, create key), bounded by small
// limits so that the size checks are reached too. Nothing may panic; every
// rejection must be a 4xx whose body is the API's JSON error with a kind
// and a message; every accepted request must be within the limits.
func FuzzDecodeRequests(f *testing.F) {
	for _, seed := range []struct {
		endpoint uint8
		json     bool
		query    string
		body     string
	}{
		{0, true, "", `{"template":"minimal","limits":{"memory_bytes":134217728},"env":["A=1"],"recovery":"fast"}`},
		{1, true, "", `{"args":["sh","-c","echo hi"],"env":["X=1"],"stdin":"aGk=","timeout_ms":100}`},
		{1, false, "arg=echo&arg=hi&tty=true&timeout_ms=5", "stdin"},
		{2, true, "", `{"args":["sleep","1"],"cwd":"/"}`},
		{3, true, "", `{"tag":"before-upgrade","stop":true}`},
		{3, true, "", ``},
		{4, true, "", `{"id":"acme","name":"Acme"}`},
		{5, true, "", `{"name":"ci","scopes":["read","write"],"expires_at":"2030-01-01T00:00:00Z"}`},
		{0, true, "", `{"template":"minimal"} {"template":"x"}`},
		{1, true, "", `{"args":[]}`},
		{5, true, "", `{"name":"ci","scopes":["root"]}`},
		{0, true, "", `{"env":` + string(bytes.Repeat([]byte(`"A=1",`), 300)) + `"B=2"]}`},
	} {
		f.Add(seed.endpoint, seed.json, seed.query, []byte(seed.body))
	}
	limits := Limits{MaxBodyBytes: 4 << 10, MaxArgs: 16, MaxEnv: 16, MaxCommandBytes: 512}
	s := &Server{limits: limits.withDefaults()}
	f.Fuzz(func(t *testing.T, endpoint uint8, isJSON bool, query string, body []byte) {
		q, err := url.ParseQuery(query)
		if err != nil {
			q = url.Values{}
		}
		r := httptest.NewRequest("POST", "/?"+q.Encode(), bytes.NewReader(body))
		if isJSON {
			r.Header.Set("Content-Type", "application/json")
		}
		w := httptest.NewRecorder()
		var args, env []string
		switch endpoint % 6 {
		case 0:
			s.limitBody(w, r)
			var req api.CreateSandboxRequest
			req, err = s.decodeCreateSandbox(r)
			env = req.Env
		case 1:
			var req api.ExecRequest
			req, _, _, err = s.decodeExec(w, r)
			args, env = req.Args, req.Env
		case 2:
			s.limitBody(w, r)
			var req api.StartProcessRequest
			req, err = s.decodeStartProcess(r)
			args, env = req.Args, req.Env
		case 3:
			s.limitBody(w, r)
			_, err = s.decodeCheckpoint(r)
		case 4:
			s.limitBody(w, r)
			_, err = s.decodeCreateTenant(r)
		case 5:
			s.limitBody(w, r)
			_, _, err = s.decodeCreateKey(r)
		}
		if err == nil {
			if len(args) > limits.MaxArgs || len(env) > limits.MaxEnv {
				t.Fatalf("accepted %d args and %d env entries over the limits", len(args), len(env))
			}
			return
		}
		status := errdefs.HTTPStatus(err)
		if status < 400 || status >= 500 {
			t.Fatalf("rejection with status %d (%s): %v", status, errdefs.Kind(err), err)
		}
		rec := httptest.NewRecorder()
		writeError(rec, err)
		var e api.Error
		if rec.Code != status || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("error written as %d %q", rec.Code, rec.Header().Get("Content-Type"))
		}
		if jerr := json.Unmarshal(rec.Body.Bytes(), &e); jerr != nil || e.Error.Kind == "" || e.Error.Message == "" {
			t.Fatalf("error body %q: %v", rec.Body.String(), jerr)
		}
	})
}
