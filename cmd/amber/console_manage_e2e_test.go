package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
)

// TestE2EConsoleManage drives the console in headless Chromium against a
// real daemon: one error box for a refused key, and a favicon; a sandbox
// created from the Sandboxes page and destroyed from its own; "Restore to
// #N" offered exactly on the events at or after the first checkpoint's cut;
// a session created from the Sessions page and terminated from its own; a
// read-only key's write buttons disabled with the reason as their title; an
// expired key marked on the admin Keys page. Each is checked through the
// API as well as on the page.
func TestE2EConsoleManage(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	d.must("tenant", "create", "acme")
	keyRW := strings.TrimSpace(d.must("key", "create", "console", "--tenant", "acme", "--scope", "read,write"))
	keyRO := strings.TrimSpace(d.must("key", "create", "viewer", "--tenant", "acme", "--scope", "read"))
	adminKey, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cl, err := client.New(addr, keyRW)
	if err != nil {
		t.Fatal(err)
	}
	op, err := client.New(addr, strings.TrimSpace(string(adminKey)))
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+addr)

	// A refused key: one error box, not two.
	b.open("/sessions")
	b.wait("the sign-in page", `document.querySelector('[data-testid=key]')`, 30*time.Second)
	b.typeIn(`[data-testid=key]`, "amber_not_a_key_000000000000")
	b.click(`[data-testid=signin]`)
	b.wait("the refusal", `(document.querySelector('.error')||{}).innerText?.includes('not valid')`, 30*time.Second)
	time.Sleep(time.Second) // a second box would have come by now
	if n := evalAs[int](b, `document.querySelectorAll('.error').length`); n != 1 {
		b.fail("a refused key shows %d error boxes, want 1", n)
	}
	// The favicon: linked, served, an SVG.
	fav := awaitJS(b, `(async () => { const l = document.querySelector('link[rel=icon]'); if (!l) return 'no link';
		const r = await fetch(l.href); return r.status + ' ' + r.headers.get('Content-Type') + ' ' + new URL(l.href).pathname })()`)
	if fav != "200 image/svg+xml /console/favicon.svg" {
		b.fail("favicon: %q", fav)
	}

	// Create a sandbox from the Sandboxes page.
	b.signIn(keyRW)
	// (A sandbox that is not there: its error once, not once per call.)
	b.open("/sandboxes/sbx-nosuchsandbox00/checkpoints")
	b.wait("not found", `(document.querySelector('.error')||{}).innerText?.includes('not found')`, 30*time.Second)
	time.Sleep(time.Second)
	if n := evalAs[int](b, `document.querySelectorAll('.error').length`); n != 1 {
		b.fail("a sandbox not found shows %d error boxes, want 1", n)
	}
	b.open("/sandboxes")
	b.wait("the templates", `[...document.querySelectorAll('[data-testid=new-sandbox-template] option')].some(o => o.value === 'minimal')`, 30*time.Second)
	evalAs[bool](b, `(() => { const s = document.querySelector('[data-testid=new-sandbox-template]'); s.value = 'minimal'; s.dispatchEvent(new Event('change', {bubbles: true})); return true })()`)
	b.click(`[data-testid=create-sandbox]`)
	b.wait("the new sandbox's page", `location.hash.startsWith('#/sandboxes/sbx-')`, 90*time.Second)
	id := strings.TrimPrefix(evalAs[string](b, `location.hash`), "#/sandboxes/")
	if sb, err := cl.GetSandbox(ctx, id); err != nil || sb.State != "running" || sb.Template != "minimal" {
		t.Fatalf("the sandbox the console created: %+v, %v", sb, err)
	}
	b.shot("manage-01-created")

	// Restore to #N: none before any checkpoint; then exactly on the events
	// at or after the first checkpoint's cut.
	b.open("/sandboxes/" + id + "/checkpoints")
	b.wait("the lifecycle events", `document.querySelectorAll('[data-testid=lifecycle-event]').length > 0 && document.querySelector('[data-testid=no-restore]')`, 30*time.Second)
	if n := evalAs[int](b, `document.querySelectorAll('[data-testid=restore-to-event]').length`); n != 0 {
		b.fail("%d Restore to #N buttons before any checkpoint", n)
	}
	ck, err := cl.Checkpoint(ctx, id, api.CreateCheckpointRequest{Tag: "one"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Exec(ctx, id, api.ExecRequest{Cmd: "echo after > /tmp/after"}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	b.wait("the checkpoint", fmt.Sprintf(`document.querySelector('[data-testid=checkpoint][data-id=%q]')`, ck.ID), 30*time.Second)
	b.wait("the restore buttons", `document.querySelector('[data-testid=restore-to-event]')`, 30*time.Second)
	rows := evalAs[[]map[string]any](b, `[...document.querySelectorAll('[data-testid=lifecycle-event]')].map(r => ({seq: Number(r.dataset.seq), button: !!r.querySelector('[data-testid=restore-to-event]')}))`)
	before, after := 0, 0
	for _, r := range rows {
		seq, button := uint64(r["seq"].(float64)), r["button"].(bool)
		if button != (seq >= ck.Seq) {
			b.fail("event #%d: Restore button %v; the checkpoint is cut at #%d", seq, button, ck.Seq)
		}
		if button {
			after++
		} else {
			before++
		}
	}
	if before == 0 || after == 0 {
		b.fail("events before the cut %d, at or after %d: want some of each (%v)", before, after, rows)
	}
	b.shot("manage-02-restore-to")

	// A read-only key: every write button disabled, the reason its title.
	b.signIn(keyRO)
	b.open("/sandboxes/" + id)
	b.wait("the sandbox page", `document.querySelector('[data-testid=kill]')`, 30*time.Second)
	for _, sel := range []string{"checkpoint-now", "recover-latest", "kill", "destroy"} {
		b.wait(sel+" disabled with a reason", fmt.Sprintf(`(b => b && b.disabled && b.title.includes('scope write') && b.title.includes('viewer'))(document.querySelector('[data-testid=%s]'))`, sel), 10*time.Second)
	}
	b.open("/sandboxes/" + id + "/checkpoints")
	b.wait("restore disabled with a reason", `(b => b && b.disabled && b.title.includes('scope write'))(document.querySelector('[data-testid=restore-to-event]'))`, 30*time.Second)
	b.open("/sandboxes/" + id + "/terminal")
	b.wait("no terminal", `(document.querySelector('[data-testid=term-denied]')||{}).innerText?.includes('scope write')`, 30*time.Second)
	b.open("/sandboxes")
	b.wait("create disabled", `(b => b && b.disabled && b.title.includes('scope write'))(document.querySelector('[data-testid=create-sandbox]'))`, 30*time.Second)
	b.open("/sessions")
	b.wait("new session disabled", `(b => b && b.disabled && b.title.includes('scope write'))(document.querySelector('[data-testid=new-session]'))`, 30*time.Second)
	b.shot("manage-03-read-only")

	// Destroy it from its page (read-write key), in two clicks.
	b.signIn(keyRW)
	b.open("/sandboxes/" + id)
	b.wait("the destroy button", `(b => b && !b.disabled)(document.querySelector('[data-testid=destroy]'))`, 30*time.Second)
	jsClick(b, "destroy")
	jsClick(b, "destroy-yes")
	b.wait("back to the list", `location.hash === '#/sandboxes'`, 60*time.Second)
	if sb, err := cl.GetSandbox(ctx, id); !errdefs.IsNotFound(err) && sb.State != "destroyed" {
		t.Fatalf("after Destroy the sandbox is %+v, %v", sb, err)
	}

	// A session created from the Sessions page, then terminated.
	def, _ := json.Marshal(map[string]any{"model": map[string]any{"adapter": "scripted", "script": []map[string]any{{"text": "hello from the console"}}},
		"template": "minimal", "policy": "fast"})
	b.open("/sessions")
	b.wait("the new-session button", `document.querySelector('[data-testid=new-session]')`, 30*time.Second)
	b.click(`[data-testid=new-session]`)
	evalAs[bool](b, fmt.Sprintf(`(() => { const a = document.querySelector('[data-testid=new-session-def]'); a.value = %q; a.dispatchEvent(new Event('input', {bubbles: true})); return true })()`, def))
	b.click(`[data-testid=create-session]`)
	b.wait("the new session's page", `location.hash.startsWith('#/sessions/ses')`, 30*time.Second)
	sid := strings.TrimPrefix(evalAs[string](b, `location.hash`), "#/sessions/")
	if se, err := cl.GetSession(ctx, sid); err != nil {
		t.Fatalf("the session the console created: %+v, %v", se, err)
	}
	b.wait("the session's events", `Number(document.querySelector('[data-testid=event-count]')?.innerText) > 0`, 30*time.Second)
	jsClick(b, "terminate")
	jsClick(b, "terminate-yes")
	deadline := time.Now().Add(60 * time.Second)
	for {
		se, err := cl.GetSession(ctx, sid)
		if err == nil && se.Status == "terminated" {
			break
		}
		if time.Now().After(deadline) {
			b.fail("the session after Terminate: %+v, %v", se, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	b.wait("no terminate button", `!document.querySelector('[data-testid=terminate]')`, 30*time.Second)
	b.shot("manage-04-terminated")

	// An expired key is marked; a live one is not.
	exp := time.Now().Add(2 * time.Second)
	if _, err := op.CreateKey(ctx, "acme", api.CreateKeyRequest{Name: "shortlived", Scopes: []string{"read"}, ExpiresAt: &exp}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(exp) + 500*time.Millisecond)
	b.signIn(strings.TrimSpace(string(adminKey)))
	b.open("/admin/keys/acme")
	b.wait("the expired key marked", `(r => r && r.dataset.expired === 'true' && r.innerText.includes('expired'))(document.querySelector('[data-testid=key-row][data-name=shortlived]'))`, 30*time.Second)
	if live := evalAs[string](b, `document.querySelector('[data-testid=key-row][data-name=viewer]')?.dataset.expired`); live != "false" {
		b.fail("the live key viewer is marked expired=%q", live)
	}
	b.shot("manage-05-expired-key")
}

// awaitJS evaluates an expression that makes a promise of a string and
// waits for it.
func awaitJS(b *browser, expression string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expression, chromedp.EvalAwaitPromise))
	if err != nil {
		b.fail("evaluate %s: %v", expression, err)
	}
	return v
}

// jsClick waits for the element with this data-testid, enabled, and clicks
// it from the page's own script: the two-step buttons change under the
// pointer, and the graphs above them redraw every 2 s.
func jsClick(b *browser, testid string) {
	b.t.Helper()
	sel := fmt.Sprintf(`document.querySelector('[data-testid=%s]')`, testid)
	b.wait(testid, "(e => e && !e.disabled)("+sel+")", 30*time.Second)
	evalAs[bool](b, "("+sel+".click(), true)")
}
