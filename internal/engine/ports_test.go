package engine_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// hiddenDialer hides the driver's optional powers (a driver without
// PortDialer).
type hiddenDialer struct{ sandbox.Driver }

func TestPortsWithoutPortDialerAreNotImplemented(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "t1", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{Driver: hiddenDialer{env.Driver}, Meta: env.Meta, Log: env.Log, Templates: env.Catalog, WatchInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Expose(ctx, "t1", sb.ID, 8080); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Expose: %v", err)
	}
	if _, err := e.DialPort(ctx, "t1", sb.ID, 8080); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("DialPort: %v", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := env.Engine.DialPort(ctx, "t1", sb.ID, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("DialPort port %d: %v", p, err)
		}
		if _, err := env.Engine.Expose(ctx, "t1", sb.ID, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Expose port %d: %v", p, err)
		}
	}
}

func TestExposeResolveAndDial(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	if _, ok := env.Driver.(sandbox.PortDialer); !ok {
		t.Skipf("driver %s has no PortDialer", env.Driver.Name())
	}
	ctx := context.Background()
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "t1", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Engine.Exec(ctx, "t1", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "mkdir -p /www && echo hi > /www/index.html && httpd -p 127.0.0.1:8080 -h /www"}}); err != nil {
		t.Fatal(err)
	}
	// Another tenant neither dials nor exposes it.
	if _, err := env.Engine.DialPort(ctx, "t2", sb.ID, 8080); !errdefs.IsNotFound(err) {
		t.Errorf("DialPort by another tenant: %v", err)
	}
	if _, err := env.Engine.Expose(ctx, "t2", sb.ID, 8080); !errdefs.IsNotFound(err) {
		t.Errorf("Expose by another tenant: %v", err)
	}
	x, err := env.Engine.Expose(ctx, "t1", sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	if x.SandboxID != sb.ID || x.Port != 8080 || len(x.Token) < 40 {
		t.Fatalf("exposure %+v", x)
	}
	if tenant, err := env.Engine.ResolveExposure(ctx, sb.ID, 8080, x.Token); err != nil || tenant != "t1" {
		t.Fatalf("resolve: %q %v", tenant, err)
	}
	for _, c := range []struct {
		id    string
		port  int
		token string
	}{{sb.ID, 8080, x.Token + "x"}, {sb.ID, 8081, x.Token}, {"sbx-other", 8080, x.Token}, {"../x", 8080, x.Token}, {sb.ID, 8080, ""}} {
		if _, err := env.Engine.ResolveExposure(ctx, c.id, c.port, c.token); !errdefs.IsNotFound(err) {
			t.Errorf("resolve %+v: %v", c, err)
		}
	}
	// The tokens are not stored, only their hashes.
	xs, err := env.Engine.Exposures(ctx, "t1", sb.ID)
	if err != nil || len(xs) != 1 || xs[0].Token != "" || xs[0].Port != 8080 {
		t.Fatalf("exposures: %+v %v", xs, err)
	}
	var conn io.ReadWriteCloser
	deadline := time.Now().Add(10 * time.Second)
	for conn == nil {
		c, err := env.Engine.DialPort(ctx, "t1", sb.ID, 8080)
		if err == nil {
			conn = c
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET / HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "hi\n" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	// Killed: no dial; destroyed: the exposure is gone.
	if _, err := env.Engine.Kill(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Engine.DialPort(ctx, "t1", sb.ID, 8080); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("DialPort of a killed sandbox: %v", err)
	}
	if err := env.Engine.Destroy(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Engine.ResolveExposure(ctx, sb.ID, 8080, x.Token); !errdefs.IsNotFound(err) {
		t.Errorf("resolve after destroy: %v", err)
	}
}
