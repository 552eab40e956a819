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
