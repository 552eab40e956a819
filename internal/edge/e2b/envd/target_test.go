package envd

import (
	"net/http/httptest"
	"testing"
)

// TestTarget: the sandbox comes from the host 49983-<id>.<domain> or the
// SDK's E2b-Sandbox-Id header; a mismatch and no naming at all are
// refused.
func TestTarget(t *testing.T) {
	for _, c := range []struct {
		host, id, port string
		want           string
		wantPort       int
		bad            bool
	}{
		{host: "49983-sbx-abc.e2b.local", want: "sbx-abc", wantPort: 49983},
		{host: "49983-sbx-abc.e2b.local:8443", id: "sbx-abc", want: "sbx-abc", wantPort: 49983},
		{host: "3000-sbx-abc.e2b.local", want: "sbx-abc", wantPort: 3000},
		{host: "127.0.0.1:7000", id: "sbx-abc", port: "49983", want: "sbx-abc", wantPort: 49983},
		{host: "localhost", id: "sbx-abc", want: "sbx-abc", wantPort: 49983},
		{host: "49983-sbx-abc.e2b.local", id: "sbx-other", bad: true},
		{host: "127.0.0.1:7000", bad: true},
		{host: "127.0.0.1:7000", id: "sbx-abc", port: "http", bad: true},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = c.host
		if c.id != "" {
			r.Header.Set("E2b-Sandbox-Id", c.id)
		}
		if c.port != "" {
			r.Header.Set("E2b-Sandbox-Port", c.port)
		}
		id, port, err := Target(r)
		if c.bad {
			if err == nil {
				t.Errorf("%+v: got %s %d, want an error", c, id, port)
			}
			continue
		}
		if err != nil || id != c.want || port != c.wantPort {
			t.Errorf("%+v: got %s %d %v", c, id, port, err)
		}
	}
}

// FuzzTarget: any Host and headers give a sandbox id and a port in range,
// or an error; never a panic, never an empty id.
func FuzzTarget(f *testing.F) {
	f.Add("49983-sbx-abc.e2b.local", "", "")
	f.Add("127.0.0.1:7000", "sbx-abc", "49983")
	f.Add("-.x", "", "0")
	f.Add("99999999999999999999-a.b", "x", "-1")
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = host
		r.Header["E2b-Sandbox-Id"] = []string{id}
		r.Header["E2b-Sandbox-Port"] = []string{port}
		gid, gport, err := Target(r)
		if err != nil {
			return
		}
		if gid == "" || gport <= 0 || gport > 65535 {
			t.Fatalf("host %q id %q port %q: got %q %d", host, id, port, gid, gport)
		}
	})
}

func TestIsPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/files": true, "/health": true, "/process.Process/Start": true, "/filesystem.Filesystem/Stat": true,
		"/": false, "/v1/sandboxes": false, "/e2b/sandboxes": false, "/files/x": false, "/process.Process": false, "/healthz": false,
	} {
		if IsPath(p) != want {
			t.Errorf("IsPath(%q) = %v", p, !want)
		}
	}
}
