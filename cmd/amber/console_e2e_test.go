package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// consoleScript: two turns, each a command that changes the sandbox (so the
// strict policy cuts a checkpoint after each) and an answer.
const consoleScript = `[
 {"text": "writing step one", "tool_calls": [{"name": "bash", "input": {"command": "echo one > /tmp/step; cat /tmp/step"}}]},
 {"text": "step one done"},
 {"text": "writing step two", "tool_calls": [{"name": "bash", "input": {"command": "echo two >> /tmp/step; cat /tmp/step"}}]},
 {"text": "step two done"},
 {"text": "still here"}
]`

// browser is a headless Debian Chromium driven over CDP (chromedp).
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string // http://addr
	dir  string // screenshots
}

// newBrowser starts /usr/bin/chromium (scripts/setup/browser-deps.sh
// installs it) with a new profile; it is closed (by its PID, which chromedp
// started) when the test ends.
func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	exe, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (make setup-browser-deps)")
		}
		t.Skip("chromium is not installed (make setup-browser-deps)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 960),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil { // starts the browser
		acancel()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() { cancel(); acancel() })
	dir := os.Getenv("AMBER_ARTIFACTS")
	if dir != "" {
		dir = filepath.Join(dir, "console")
		os.MkdirAll(dir, 0o755)
	} else {
		dir = t.ArtifactDir()
	}
	return &browser{t: t, ctx: ctx, base: base, dir: dir}
}

func (b *browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fail("%s: %v", what, err)
	}
}

// js evaluates expression in the page.
func js[T any](b *browser, expression string) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expression))
}

// fail saves a screenshot and the page's text, then fails the test.
func (b *browser) fail(format string, args ...any) {
	b.t.Helper()
	b.shot("failure")
	text, _ := js[string](b, `document.body.innerText`)
	b.t.Fatalf(format+"\npage:\n%s", append(args, tail(text, 60))...)
}

// wait polls the JavaScript expression (a boolean) until it is true.
func (b *browser) wait(what, expression string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := js[bool](b, "!!("+expression+")")
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.fail("waited %s for %s (%s): err %v", timeout, what, expression, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func evalAs[T any](b *browser, expression string) T {
	b.t.Helper()
	v, err := js[T](b, expression)
	if err != nil {
		b.fail("evaluate %s: %v", expression, err)
	}
	return v
}

func (b *browser) open(hash string) {
	b.t.Helper()
	b.run("open "+hash, chromedp.Navigate(b.base+"/console/#"+hash))
}

func (b *browser) click(sel string) {
	b.t.Helper()
	b.run("click "+sel, chromedp.Click(chromedp.CSS(sel)))
}

func (b *browser) typeIn(sel, text string) {
	b.t.Helper()
	b.run("type into "+sel, chromedp.SendKeys(chromedp.CSS(sel), text))
}

func (b *browser) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p := filepath.Join(b.dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.t.Logf("screenshot %s", p)
}

func (b *browser) signIn(key string) {
	b.t.Helper()
	b.run("sign out", chromedp.Navigate(b.base+"/console/"))
	evalAs[bool](b, `sessionStorage.clear(), true`)
	b.run("reload", chromedp.Reload())
	b.wait("the sign-in form", `document.querySelector('[data-testid=key]')`, 30*time.Second)
	b.typeIn(`[data-testid=key]`, key)
	b.click(`[data-testid=signin]`)
	b.wait("signed in", `document.querySelector('[data-testid=tenant]')`, 30*time.Second)
}

// TestE2EConsole drives the web console in Debian's headless Chromium
// against a real daemon and real sandboxes: sign in with a tenant's key;
// watch a session's events arrive live over SSE while the agent works; kill
// the session's sandbox from the CLI and see the restore appear in the
// timeline; restore the sandbox to an earlier event from its checkpoint
// page and find its files as they were then; open the terminal (a PTY over
// a WebSocket) and run a command; see the live resource graphs and the
// admin pages (audit chain verified). A second tenant's key sees nothing of
// the first's. Screenshots of each page are saved as artefacts
// ($AMBER_ARTIFACTS/console, else the test's artifact dir: go test
// -artifacts keeps it).
func TestE2EConsole(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	// A shop on loopback that sandboxes reach by name through the gateway.
	var shopHits atomic.Int64
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		shopHits.Add(1)
		fmt.Fprintf(w, "item-%d\n", shopHits.Load())
	}))
	defer shop.Close()
	shopPort := shop.Listener.Addr().(*net.TCPAddr).Port
	d := startDaemon(t, bin, dir, addr, "--pool", "0", "--egress-host", "shop.test=127.0.0.1")
	base := "http://" + addr

	d.must("tenant", "create", "acme")
	d.must("tenant", "create", "globex")
	keyA := strings.TrimSpace(d.must("key", "create", "console", "--tenant", "acme", "--scope", "read,write"))
	keyB := strings.TrimSpace(d.must("key", "create", "console", "--tenant", "globex", "--scope", "read,write"))
	adminKey, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	as := func(token string, args ...string) string {
		t.Helper()
		out, errs, code := d.amber(append([]string{"--token", token}, args...)...)
		if code != 0 {
			t.Fatalf("amber %v: %d %s\n%s", args, code, errs, tail(d.log(), 30))
		}
		return out
	}
	script := filepath.Join(dir, "script.json")
	if err := os.WriteFile(script, []byte(consoleScript), 0o644); err != nil {
		t.Fatal(err)
	}
	sid := strings.TrimSpace(as(keyA, "session", "create", "--model", "scripted", "--script", script, "--template", "minimal", "--policy", "strict"))
	cl, err := client.New(addr, keyA)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// The console is served by the daemon, without a key.
	b := newBrowser(t, base)
	b.open("/sessions")
	b.wait("the sign-in page", `!!document.querySelector('[data-testid=key]')`, 30*time.Second)
	b.shot("01-sign-in")

	// A wrong key is refused; acme's key signs in.
	b.typeIn(`[data-testid=key]`, "amber_not_a_key_000000000000")
	b.click(`[data-testid=signin]`)
	b.wait("the refusal", `(document.querySelector('[data-testid=error]')||{}).innerText?.includes('not valid')`, 30*time.Second)
	b.signIn(keyA)
	who := evalAs[string](b, `document.querySelector('[data-testid=tenant]').innerText`)
	if !strings.Contains(who, "acme") {
		t.Fatalf("signed in as %q, want tenant acme", who)
	}
	b.wait("the session in the list", fmt.Sprintf(`!!document.querySelector('[data-testid=session-row][data-id=%q]')`, sid), 30*time.Second)
	b.shot("02-sessions")

	// The session page follows the log live: the user's message is sent
	// from the page and the agent's work arrives without a reload.
	b.open("/sessions/" + sid)
	b.wait("the stream", `document.querySelector('[data-testid=stream-state]')?.innerText === 'live'`, 60*time.Second)
	before := evalAs[int](b, `document.querySelectorAll('[data-testid=event]').length`)
	b.typeIn(`[data-testid=msg]`, "write step one")
	b.click(`[data-testid=send]`)
	b.wait("the tool result and the answer", `[...document.querySelectorAll('[data-testid=msg-agent]')].some(e => e.innerText.includes('step one done')) &&
		[...document.querySelectorAll('[data-testid=tool-result]')].some(e => e.innerText.includes('one'))`, 3*time.Minute)
	b.wait("idle", `[...document.querySelectorAll('[data-testid=event][data-type="session.status"]')].pop()?.innerText.includes('idle')`, time.Minute)
	seqs := evalAs[[]int](b, `[...document.querySelectorAll('[data-testid=event]')].map(e => +e.dataset.seq)`)
	if len(seqs) <= before {
		t.Fatalf("no new events arrived live: %d before, %v after", before, seqs)
	}
	for i, s := range seqs {
		if s != i+1 {
			t.Fatalf("timeline seqs %v: not each event once, in order", seqs)
		}
	}
	all, err := cl.SessionEvents(ctx, sid, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Events) < len(seqs) {
		t.Fatalf("the page shows %d events, the log has %d", len(seqs), len(all.Events))
	}
	b.shot("03-session-live")

	se, err := cl.GetSession(ctx, sid)
	if err != nil || se.Sandbox == "" {
		t.Fatalf("session: %+v %v", se, err)
	}
	sbx := se.Sandbox

	// Kill the sandbox from the CLI; the next turn restores it, and the
	// restore appears in the page's timeline and conversation.
	as(keyA, "sandbox", "kill", sbx)
	b.typeIn(`[data-testid=msg]`, "write step two")
	b.click(`[data-testid=send]`)
	b.wait("the restore in the timeline", `!!document.querySelector('[data-testid=event][data-type="session.sandbox_restored"]') && !!document.querySelector('[data-testid=msg-restored]')`, 3*time.Minute)
	b.wait("the second answer", `[...document.querySelectorAll('[data-testid=tool-result]')].some(e => e.innerText.includes('one\ntwo'))`, 3*time.Minute)
	b.shot("04-session-restored")

	// The list shows the session's sandbox and the tokens its log records.
	b.open("/sessions")
	b.wait("the session's usage in the list", fmt.Sprintf(`(() => { const r = document.querySelector('[data-testid=session-row][data-id=%q]');
		return r && /^[1-9][0-9]* in \/ [1-9][0-9]* out$/.test(r.querySelector('[data-testid=tokens]').innerText) && r.innerText.includes('idle') })()`, sid), time.Minute)
	b.shot("04b-sessions-usage")

	// The daemon dies (SIGKILL) and a new one starts: the open page
	// reconnects with Last-Event-ID and goes on, each event once.
	b.open("/sessions/" + sid)
	b.wait("the stream", `document.querySelector('[data-testid=stream-state]')?.innerText === 'live'`, 60*time.Second)
	d.stop(syscall.SIGKILL)
	b.wait("the page noticing", `document.querySelector('[data-testid=stream-state]')?.innerText === 'reconnecting'`, 60*time.Second)
	d = startDaemon(t, bin, dir, addr, "--pool", "0", "--egress-host", "shop.test=127.0.0.1")
	b.wait("the stream resumed", `document.querySelector('[data-testid=stream-state]')?.innerText === 'live'`, 60*time.Second)
	b.typeIn(`[data-testid=msg]`, "are you there")
	b.click(`[data-testid=send]`)
	b.wait("the answer after the restart", `[...document.querySelectorAll('[data-testid=msg-agent]')].some(e => e.innerText.includes('still here'))`, 3*time.Minute)
	seqs = evalAs[[]int](b, `[...document.querySelectorAll('[data-testid=event]')].map(e => +e.dataset.seq)`)
	for i, s := range seqs {
		if s != i+1 {
			t.Fatalf("timeline after the daemon restart %v: not each event once, in order", seqs)
		}
	}

	// Restore to an earlier event: the cut after step one. The session cut
	// its new sandbox once before its first tool call (so a loss is always
	// restored in place), then after each step: the sandbox's checkpoints
	// in cut order are [before step one, after step one, ...]. The button
	// restores the newest committed checkpoint cut at or before its event;
	// clicked on the second cut's own event, that is the second cut. Its
	// files come back as they were then.
	se, _ = cl.GetSession(ctx, sid)
	sbx = se.Sandbox
	cks, err := cl.ListCheckpoints(ctx, sbx, false)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(cks, func(i, j int) bool { return cks[i].Seq < cks[j].Seq })
	if len(cks) < 3 {
		t.Fatalf("sandbox %s has %d committed checkpoints, want the first cut, one after each step: %+v", sbx, len(cks), cks)
	}
	cut := cks[1]
	evs, err := cl.Events(ctx, sbx, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var firstCut api.Event // the sandbox.checkpointed event of cut
	restoresBefore := 0
	for _, ev := range evs.Events {
		var p struct{ Checkpoint string }
		json.Unmarshal(ev.Payload, &p)
		if ev.Type == "sandbox.checkpointed" && p.Checkpoint == cut.ID {
			firstCut = ev
		}
		if ev.Type == "sandbox.restored" {
			restoresBefore++
		}
	}
	if firstCut.Seq == 0 {
		t.Fatalf("sandbox %s has no checkpoint event for %s: %+v", sbx, cut.ID, evs.Events)
	}
	for _, c := range cks[2:] {
		if c.Seq <= firstCut.Seq {
			t.Fatalf("checkpoint %s was cut at event %d, at or before the event %d of the cut after step one", c.ID, c.Seq, firstCut.Seq)
		}
	}
	b.open("/sandboxes/" + sbx + "/checkpoints")
	b.wait("the checkpoint tree", `document.querySelectorAll('[data-testid=checkpoint]').length >= 2 && document.querySelectorAll('[data-testid=restore-report]').length >= 1`, time.Minute)
	b.shot("05-checkpoints")
	b.click(fmt.Sprintf(`[data-testid=lifecycle-event][data-seq="%d"] [data-testid=restore-to-event]`, firstCut.Seq))
	b.wait("the restore to the event", `!!document.querySelector('[data-testid=op-done]')`, 3*time.Minute)
	evs, err = cl.Events(ctx, sbx, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var last api.Event
	restoresAfter := 0
	for _, ev := range evs.Events {
		if ev.Type == "sandbox.restored" {
			restoresAfter++
			last = ev
		}
	}
	var rp struct{ Checkpoint string }
	json.Unmarshal(last.Payload, &rp)
	if restoresAfter != restoresBefore+1 || rp.Checkpoint != cut.ID {
		t.Fatalf("after restore to event %d: %d restores (were %d), the last from %q, want %q", firstCut.Seq, restoresAfter, restoresBefore, rp.Checkpoint, cut.ID)
	}
	if got := strings.TrimSpace(as(keyA, "exec", sbx, "--", "cat", "/tmp/step")); got != "one" {
		t.Fatalf("/tmp/step after restoring to event %d = %q, want \"one\" (as it was at that cut)", firstCut.Seq, got)
	}
	b.wait("the new restore's fidelity report", fmt.Sprintf(`!!document.querySelector('[data-testid=restore-report][data-seq="%d"]')`, last.Seq), time.Minute)
	b.shot("06-restored-to-event")

	// Fork the first checkpoint: a new sandbox, whose page says where it
	// came from; the original is untouched.
	b.click(fmt.Sprintf(`[data-testid=checkpoint][data-id=%q] > .ck-line [data-testid=fork]`, cut.ID))
	b.wait("the fork's page", fmt.Sprintf(`!location.hash.includes(%q) && [...document.querySelectorAll('.fork')].some(e => e.innerText.includes('a fork of %s'))`, sbx, sbx), 3*time.Minute)
	forkID := evalAs[string](b, `decodeURIComponent(location.hash.split('/')[2])`)
	fork, err := cl.GetSandbox(ctx, forkID)
	if err != nil || fork.Origin != cut.ID || fork.State != "running" {
		t.Fatalf("fork %s: %+v %v, want running from %s", forkID, fork, err, cut.ID)
	}
	if got := strings.TrimSpace(as(keyA, "exec", forkID, "--", "cat", "/tmp/step")); got != "one" {
		t.Fatalf("/tmp/step in the fork = %q, want \"one\"", got)
	}
	b.shot("06b-fork")

	// The terminal: a shell on a PTY over a WebSocket.
	b.open("/sandboxes/" + sbx + "/terminal")
	b.wait("the terminal", `document.querySelector('[data-testid=term-state]')?.innerText === 'open'`, time.Minute)
	b.wait("a prompt", `(document.querySelector('.xterm-rows')?.innerText || '').trim().length > 0`, time.Minute)
	// Typed as text input (as an IME or a paste gives it: one input event),
	// then Enter as a key.
	evalAs[bool](b, `document.querySelector('.xterm-helper-textarea').focus(), true`)
	ictx, icancel := context.WithTimeout(b.ctx, 20*time.Second)
	_, err = chromedp.Call(ictx, input.InsertText, input.InsertTextParams{Text: "echo $((6*7))-ok; cat /tmp/step"})
	icancel()
	if err != nil {
		b.fail("type into the terminal: %v", err)
	}
	b.run("press Enter", chromedp.KeyEvent("\r"))
	b.wait("the command's output", `document.querySelector('.xterm-rows').innerText.includes('42-ok')`, time.Minute)
	b.shot("07-terminal")

	// Live resource graphs.
	b.open("/sandboxes/" + sbx + "/overview")
	b.wait("memory and CPU samples", `document.querySelector('[data-testid=graph-mem-value]')?.innerText.includes('B') && document.querySelector('[data-testid=graph-cpu-value]')?.innerText.includes('%') &&
		document.querySelector('[data-testid=graph-mem]').innerText.includes('3 samples')`, time.Minute)
	b.shot("08-sandbox-graphs")
	b.open("/sandboxes/" + sbx + "/effects")
	b.wait("the effect journal", `!!document.querySelector('[data-testid=effects]')`, 30*time.Second)
	b.open("/sandboxes/" + sbx + "/files")
	b.wait("the files browser", `!!document.querySelector('[data-testid=file][data-name=tmp]')`, 30*time.Second)
	b.click(`[data-testid=file][data-name=tmp] [data-testid=file-open]`)
	b.wait("/tmp", `!!document.querySelector('[data-testid=file][data-name=step]')`, 30*time.Second)
	b.click(`[data-testid=file][data-name=step] [data-testid=file-open]`)
	b.wait("/tmp/step's content", `document.querySelector('[data-testid=file-content]')?.innerText.trim() === 'one'`, 30*time.Second)
	b.shot("09-files")

	// The effect journal: a request forwarded to the shop, then (after the
	// sandbox is recovered to the cut before it) the same request of the
	// re-run answered from the journal — the shop sees it once.
	{
		dest := fmt.Sprintf("shop.test:%d", shopPort)
		fx := strings.TrimSpace(as(keyA, "sandbox", "create", "--template", "minimal", "--egress-allow", dest))
		as(keyA, "checkpoint", fx)
		get := []string{"exec", fx, "--", "wget", "-q", "-O", "-", "http://" + dest + "/item"}
		if out := as(keyA, get...); !strings.Contains(out, "item-1") {
			t.Fatalf("wget through the gateway: %q", out)
		}
		as(keyA, "sandbox", "recover", fx)
		if out := as(keyA, get...); !strings.Contains(out, "item-1") {
			t.Fatalf("the re-run's wget: %q, want the journal's answer item-1", out)
		}
		if n := shopHits.Load(); n != 1 {
			t.Fatalf("the shop saw %d requests, want 1", n)
		}
		b.open("/sandboxes/" + fx + "/effects")
		b.wait("the effect, forwarded once and answered once from the journal", `[...document.querySelectorAll('[data-testid=effect]')].some(r =>
			r.innerText.includes('/item') && r.innerText.includes('forwarded') && r.querySelector('[data-testid=replays]').innerText === '1×')`, time.Minute)
		b.shot("09b-effects")
	}

	// The sandbox list shows metadata and the deadline (CLI flags).
	md := strings.TrimSpace(as(keyA, "sandbox", "create", "--template", "minimal", "--metadata", "team=red", "--timeout", "1h", "--on-timeout", "pause"))
	if ls := as(keyA, "sandbox", "ls", "--label", "team=red", "--state", "running"); !strings.Contains(ls, md) || strings.Contains(ls, sbx) || !strings.Contains(ls, "(pause)") {
		t.Fatalf("sandbox ls --label team=red --state running:\n%s", ls)
	}
	b.open("/sandboxes")
	b.wait("the metadata and the deadline in the list", fmt.Sprintf(`[...document.querySelectorAll('tr')].some(r => r.innerText.includes(%q) &&
		r.querySelector('[data-testid=metadata]')?.innerText === 'team=red' && r.querySelector('[data-testid=expires]')?.innerText.includes('(pause)'))`, md), 30*time.Second)
	as(keyA, "sandbox", "rm", md)

	// Tenant globex's key sees nothing of acme's: not in the lists, and not
	// by address.
	b.signIn(keyB)
	b.open("/sessions")
	b.wait("globex's empty list", `document.querySelector('[data-testid=sessions]')?.innerText.includes('No sessions')`, 30*time.Second)
	b.open("/sandboxes")
	b.wait("globex's empty sandboxes", `document.querySelector('[data-testid=sandboxes]')?.innerText.includes('No sandboxes')`, 30*time.Second)
	b.open("/sessions/" + sid)
	b.wait("acme's session not found", `(document.querySelector('[data-testid=error]')?.innerText || '').includes('not found') && document.querySelector('[data-testid=stream-state]')?.innerText.startsWith('error')`, 30*time.Second)
	b.open("/sandboxes/" + sbx + "/checkpoints")
	b.wait("acme's sandbox not found", `(document.querySelector('[data-testid=error]')?.innerText || '').includes('not found')`, 30*time.Second)
	page := evalAs[string](b, `document.body.innerText`)
	if strings.Contains(page, cut.ID) || strings.Contains(page, "step one") || strings.Contains(page, "acme") {
		t.Fatalf("globex's console shows acme's data:\n%s", page)
	}
	if evalAs[bool](b, `!!document.querySelector('[data-testid=nav-admin]')`) {
		t.Fatal("a key without scope admin is shown the admin pages")
	}
	b.shot("10-other-tenant")

	// The operator's key: tenants, keys, audit trail verified.
	b.signIn(strings.TrimSpace(string(adminKey)))
	b.open("/admin/tenants")
	b.wait("the tenants", `!!document.querySelector('[data-testid=tenant-row][data-id=acme]') && !!document.querySelector('[data-testid=tenant-row][data-id=globex]')`, 30*time.Second)
	b.shot("11-admin-tenants")
	b.open("/admin/audit/acme")
	b.wait("acme's verified audit trail", `(document.querySelector('[data-testid=audit-verify]')?.innerText || '').includes('Chain verified') &&
		[...document.querySelectorAll('[data-testid=audit-row]')].some(r => r.innerText.includes('/terminal'))`, 30*time.Second)
	b.shot("12-admin-audit")
}
