package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem/filesystemconnect"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/process"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/process/processconnect"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestEnvdMounted: the daemon's server hands E2B's envd the requests for
// 49983-<id>.<port domain> and those naming a sandbox in E2b-Sandbox-Id
// outside /v1/, and nothing else: the API and other ports' origins stay
// as they were.
func TestEnvdMounted(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Envd: true}))
	t.Cleanup(ts.Close)
	get := func(host, path string, hdr map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := map[string]string{"X-Access-Token": testKey}
	if got := get("49983-"+sb.ID+"."+server.DefaultPortDomain, "/health", tok); got != 204 {
		t.Errorf("health on envd's origin: %d", got)
	}
	if got := get("127.0.0.1", "/health", map[string]string{"X-Access-Token": testKey, "E2b-Sandbox-Id": sb.ID}); got != 204 {
		t.Errorf("health by E2b-Sandbox-Id: %d", got)
	}
	if got := get("127.0.0.1", "/health", map[string]string{"E2b-Sandbox-Id": sb.ID}); got != 401 {
		t.Errorf("health without a token: %d", got)
	}
	// Another port's origin is the port proxy's (not exposed: 404), the
	// API is the API even with the header.
	if got := get("3000-"+sb.ID+"."+server.DefaultPortDomain, "/health", tok); got != 404 {
		t.Errorf("port 3000's origin: %d", got)
	}
	if got := get("127.0.0.1", "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + testKey, "E2b-Sandbox-Id": sb.ID}); got != 200 {
		t.Errorf("the API with an E2b-Sandbox-Id header: %d", got)
	}
	// A path that is not envd's is the server's, header or not (its
	// unknown route: 404; envd would say 401 without a token).
	if got := get("127.0.0.1", "/e2b/sandboxes", map[string]string{"E2b-Sandbox-Id": sb.ID}); got != 404 {
		t.Errorf("a path not envd's with an E2b-Sandbox-Id header: %d", got)
	}
}

// envdHeaders sends what the SDK sends: the sandbox and its token.
type envdHeaders struct{ id, token string }

func (h envdHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("X-Access-Token", h.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestEnvdStreamsAreTenantStreams: envd's streams count against the
// tenant's max_streams_per_tenant, and a revoked key ends them
// (Unauthenticated), as the API's streams.
func TestEnvdStreamsAreTenantStreams(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "e2b", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Envd: true,
		Limits: server.Limits{MaxStreamsPerTenant: 1}}))
	t.Cleanup(ts.Close)
	hc := &http.Client{Transport: envdHeaders{id: sb.ID, token: testKey}}
	pc := processconnect.NewProcessClient(hc, ts.URL, connect.WithProtoJSON())
	fc := filesystemconnect.NewFilesystemClient(hc, ts.URL, connect.WithProtoJSON())

	s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"60"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	ws, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/tmp"}))
	if err == nil {
		ws.Receive()
		err = ws.Err()
		ws.Close()
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a second stream over the cap of 1: %v", err)
	}
	// A Start over the cap is refused before it starts anything.
	s2, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"61"}}}))
	if err == nil {
		s2.Receive()
		err = s2.Err()
		s2.Close()
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a second Start over the cap of 1: %v", err)
	}
	ps, err := env.Engine.Processes(ctx, "default", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if len(p.Args) > 1 && p.Args[1] == "61" {
			t.Fatalf("the refused Start started %v", p)
		}
	}
	if _, err := env.Meta.RevokeKey(ctx, "default", "e2b"); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for s.Receive() {
		}
		ended <- s.Err()
	}()
	select {
	case err := <-ended:
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("the stream of a revoked key ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream of a revoked key still runs after 30 s")
	}
}
