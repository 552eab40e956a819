package server_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestReadScopeDoesNotResume: a sandbox stopped for being idle stays
// stopped under read-scope calls: its files are read from its stopped
// layer (content, stat, listing), a listing of its processes or a wait is
// a 409 naming the write-scope key that would resume it, and no restore
// happens; the next write-scope call resumes it as before.
func TestReadScopeDoesNotResume(t *testing.T) {
	c, env, url := newAPIWith(t, engine.Options{Recovery: engine.RecoveryOptions{IdleTimeout: 2 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const readKey = "amber_test_read_key_0123456789abcdef"
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "reader", Hash: meta.HashKey(readKey), Scopes: []meta.Scope{meta.ScopeRead}}); err != nil {
		t.Fatal(err)
	}
	rc, err := client.New(url, readKey)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/root/note.txt", strings.NewReader("kept while idle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pid, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	waitIdle := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			cur, err := env.Meta.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if cur.State == meta.StateStopped && strings.HasPrefix(cur.Reason, "idle") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not stopped idle after a minute: %+v", cur)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitIdle()
	restores := func() int {
		evs, err := env.Engine.Events(ctx, "default", sb.ID, 1, 1000)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs {
			if ev.Type == engine.EventRestored {
				n++
			}
		}
		return n
	}
	before := restores()

	var buf bytes.Buffer
	if err := rc.ReadFile(ctx, sb.ID, "/root/note.txt", &buf); err != nil || buf.String() != "kept while idle\n" {
		t.Errorf("read-scope read of an idle sandbox's file: %q %v", buf.String(), err)
	}
	if fi, err := rc.Stat(ctx, sb.ID, "/root/note.txt"); err != nil || fi.Size != 16 {
		t.Errorf("read-scope stat: %+v %v", fi, err)
	}
	if ents, err := rc.List(ctx, sb.ID, "/root"); err != nil || len(ents) == 0 {
		t.Errorf("read-scope list: %+v %v", ents, err)
	}
	_, err = rc.Processes(ctx, sb.ID)
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "write-scope key") {
		t.Errorf("read-scope process list of an idle sandbox: %v; want a 409 naming the write-scope key", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = rc.Wait(wctx, sb.ID, pid)
	wcancel()
	if !errdefs.IsConflict(err) {
		t.Errorf("read-scope wait in an idle sandbox: %v; want a 409", err)
	}
	cur, err := env.Meta.Get(ctx, sb.ID)
	if err != nil || cur.State != meta.StateStopped || restores() != before {
		t.Fatalf("after read-scope calls the sandbox is %s (%d restores, %d before): a read resumed it", cur.State, restores(), before)
	}

	// A write-scope call resumes it, as before.
	if _, err := c.Processes(ctx, sb.ID); err != nil {
		t.Fatalf("write-scope call on the idle sandbox: %v", err)
	}
	if cur, _ := env.Meta.Get(ctx, sb.ID); cur.State != meta.StateRunning || restores() != before+1 {
		t.Errorf("after a write-scope call: %s, %d restores", cur.State, restores())
	}
}
