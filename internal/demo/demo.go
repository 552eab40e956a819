// Package demo is amber demo: an agent session that survives a sandbox crash and a daemon
// crash without forgetting anything or ordering anything twice.
//
// It runs everything itself, on this machine only: a "shop" HTTP server on
// 127.0.0.1 with a ledger that honours Idempotency-Key, a daemon (`amber
// up`, a child process, on a temporary data dir) whose sandboxes reach the
// shop by name through the egress gateway, and a session driven by the
// scripted model. Midway it SIGKILLs the session's sandbox, and later the
// daemon itself while an order is on its way to the shop; it restarts the
// daemon and lets the session continue. It exits 0 only if every check of
// its report holds.
//
// The daemon and the shop are internal/chaos's (Daemon, Shop).
//
// May import: api, client, core, lib, internal/chaos.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/chaos"
)

// Run runs the demo, reporting to out; keep keeps its data dir afterwards.
// It fails unless every check of its report holds.
func Run(ctx context.Context, out io.Writer, keep bool, driver string) error {
	d := &demo{out: out, keep: keep, driver: driver}
	return d.run(ctx)
}

type demo struct {
	out    io.Writer
	keep   bool
	driver string

	dir    string
	shop   *chaos.Shop
	daemon *chaos.Daemon
	cl     *client.Client
	start  time.Time
	checks []demoCheck
}

type demoCheck struct {
	ok   bool
	what string
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) check(ok bool, format string, args ...any) {
	d.checks = append(d.checks, demoCheck{ok, fmt.Sprintf(format, args...)})
}

// demoCounter keeps a random token and a counter in its memory only and
// shows them in a file five times a second.
const demoCounter = `import os, random, time
token = "%08x" % random.getrandbits(32)
n = 0
while True:
    n += 1
    with open("/root/counter.tmp", "w") as f:
        f.write("%s %d\n" % (token, n))
    os.replace("/root/counter.tmp", "/root/counter.txt")
    time.sleep(0.2)
`

const demoNotes = "# Shopping trip\n\nOrder a book and a lamp, then tea.\n"

// demoScript is the agent: turn n answers the session's n-th model call.
func demoScript(shopURL string) []map[string]any {
	call := func(name string, input map[string]any) map[string]any {
		return map[string]any{"name": name, "input": input}
	}
	order := func(item string) map[string]any {
		body, _ := json.Marshal(map[string]any{"item": item, "qty": 1})
		return call("http", map[string]any{"method": "POST", "url": shopURL + "/orders",
			"headers": map[string]string{"Content-Type": "application/json"}, "body": string(body)})
	}
	return []map[string]any{
		// Phase 1: set up the workspace.
		{"tool_calls": []any{
			call("write_file", map[string]any{"path": "/root/notes.md", "content": demoNotes}),
			call("write_file", map[string]any{"path": "/root/counter.py", "content": demoCounter}),
		}},
		{"tool_calls": []any{call("bash", map[string]any{"command": "cd /root && (nohup python3 counter.py >/dev/null 2>&1 &) && " +
			"(nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory /root >/dev/null 2>&1 &) && sleep 1 && cat counter.txt"})}},
		{"text": "The workspace is ready: notes, a web server on port 8000 and a counter."},
		// Phase 2: two orders.
		{"tool_calls": []any{order("book")}},
		{"tool_calls": []any{order("lamp")}},
		{"text": "Ordered the book and the lamp."},
		// Phase 3 (after the sandbox was killed): look around, then tea.
		{"tool_calls": []any{call("bash", map[string]any{"command": "cat /root/counter.txt; curl -s http://127.0.0.1:8000/notes.md | head -n 1"})}},
		{"tool_calls": []any{order("tea")}},
		{"tool_calls": []any{call("bash", map[string]any{"command": "cat /root/counter.txt"})}},
		{"text": "Done: the book, the lamp and the tea are ordered, each once."},
	}
}

func (d *demo) run(ctx context.Context) (err error) {
	d.start = time.Now()
	if os.Geteuid() != 0 {
		return errors.New("amber demo runs sandboxes: run it as root (make demo)")
	}
	if d.dir, err = os.MkdirTemp("", "amber-demo-"); err != nil {
		return err
	}
	os.Chmod(d.dir, 0o711)
	d.shop, err = chaos.StartShop("tea")
	if err != nil {
		return err
	}
	defer d.shop.Close()
	d.say("shop on %s (a ledger that honours Idempotency-Key); data dir %s", d.shop.Addr, d.dir)

	d.daemon = &chaos.Daemon{Dir: d.dir, Args: []string{"--driver", d.driver, "--pool", "0", "--log-level", "warn",
		"--egress-host", "shop.test=127.0.0.1", "--egress-allow", fmt.Sprintf("shop.test:%d", d.shop.Port)}}
	if err := d.daemon.Start(); err != nil {
		return err
	}
	defer func() {
		if derr := d.cleanup(); err == nil {
			err = derr
		}
	}()
	if d.cl, err = d.daemon.Client(); err != nil {
		return err
	}
	d.say("daemon up (pid %d) on %s", d.daemon.Pid(), d.daemon.Addr)

	shopURL := fmt.Sprintf("http://shop.test:%d", d.shop.Port)
	se, err := d.cl.CreateSession(ctx, map[string]any{
		"model":    map[string]any{"adapter": "scripted", "script": demoScript(shopURL)},
		"template": "python", "policy": "strict",
		"system": "You run errands from a sandbox.",
	})
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	d.say("session %s (strict: every changing step is checkpointed before it is acknowledged)", se.ID)

	// Phase 1.
	if err := d.send(ctx, se.ID, "Set up the workspace.", 3); err != nil {
		return err
	}
	se, _ = d.cl.GetSession(ctx, se.ID)
	sbx := se.Sandbox
	token1, n1 := d.counter(ctx, sbx)
	d.say("phase 1 done: sandbox %s; counter in memory: token %s at %d", sbx, token1, n1)

	// Phase 2.
	if err := d.send(ctx, se.ID, "Order a book and a lamp.", 6); err != nil {
		return err
	}
	d.say("phase 2 done: orders so far %v", d.shop.Items())

	// Crash 1: the sandbox.
	if _, err := d.cl.KillSandbox(ctx, sbx); err != nil {
		return fmt.Errorf("kill sandbox: %w", err)
	}
	d.say("CRASH 1: sandbox %s SIGKILLed (every process in it)", sbx)

	// Phase 3, and crash 2 while the tea order is on its way.
	if _, err := d.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "demo-phase-3",
		Payload: json.RawMessage(`{"text":"Check the workspace, then order tea."}`)}); err != nil {
		return err
	}
	select {
	case <-d.shop.Arrived:
	case <-time.After(5 * time.Minute):
		return errors.New("the tea order never reached the shop")
	case <-ctx.Done():
		return ctx.Err()
	}
	d.say("the tea order reached the shop (booked); its answer is held back")
	if err := d.daemon.Kill(); err != nil {
		return err
	}
	d.say("CRASH 2: daemon SIGKILLed before the answer came back (the effect happened, the agent did not see it)")
	close(d.shop.Release)
	if err := d.daemon.Start(); err != nil {
		return err
	}
	if d.cl, err = d.daemon.Client(); err != nil {
		return err
	}
	d.say("daemon restarted (pid %d): it wakes the session from its log", d.daemon.Pid())
	if err := d.waitIdle(ctx, se.ID, 10); err != nil {
		return err
	}
	d.say("phase 3 done")
	return d.report(ctx, se.ID, sbx, token1, n1)
}

// send posts a user message and waits until the session is idle with
// wantCalls assistant messages.
func (d *demo) send(ctx context.Context, id, text string, wantCalls int) error {
	payload, _ := json.Marshal(map[string]string{"text": text})
	if _, err := d.cl.PostSessionEvent(ctx, id, api.PostSessionEventRequest{Type: "user_message", ID: fmt.Sprintf("demo-until-call-%d", wantCalls), Payload: payload}); err != nil {
		return err
	}
	return d.waitIdle(ctx, id, wantCalls)
}

func (d *demo) waitIdle(ctx context.Context, id string, wantCalls int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		evs, err := d.events(ctx, id)
		if err == nil {
			n, last := 0, ""
			for _, ev := range evs {
				switch ev.Type {
				case "session.assistant_message":
					n++
				case "session.status":
					var st struct{ Status, Reason string }
					json.Unmarshal(ev.Payload, &st)
					last = st.Status
					if st.Status == "needs-reconciliation" || st.Status == "terminated" {
						return fmt.Errorf("session %s is %s: %s", id, st.Status, st.Reason)
					}
				}
			}
			if n >= wantCalls && last == "idle" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("session %s did not finish its turn within 5 minutes (daemon log: %s)", id, filepath.Join(d.dir, "daemon.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (d *demo) events(ctx context.Context, id string) ([]api.Event, error) {
	var all []api.Event
	after := uint64(0)
	for {
		l, err := d.cl.SessionEvents(ctx, id, after, 1000)
		if err != nil {
			return nil, err
		}
		all = append(all, l.Events...)
		if len(l.Events) < 1000 {
			return all, nil
		}
		after = l.Events[len(l.Events)-1].Seq
	}
}

// counter reads the counter program's token and value.
func (d *demo) counter(ctx context.Context, sbx string) (string, int) {
	var b strings.Builder
	if err := d.cl.ReadFile(ctx, sbx, "/root/counter.txt", &b); err != nil {
		return "", -1
	}
	var token string
	var n int
	fmt.Sscanf(b.String(), "%s %d", &token, &n)
	return token, n
}

func (d *demo) report(ctx context.Context, id, sbx, token1 string, n1 int) error {
	evs, err := d.events(ctx, id)
	if err != nil {
		return err
	}
	calls := map[int]int{}
	results := map[string]int{}
	restores, checkpoints := 0, 0
	var lastText string
	for _, ev := range evs {
		switch ev.Type {
		case "session.assistant_message":
			var m struct {
				Call int
				Text string
			}
			json.Unmarshal(ev.Payload, &m)
			calls[m.Call]++
			lastText = m.Text
		case "session.tool_result":
			var r struct {
				ToolCallID string `json:"tool_call_id"`
				Checkpoint string `json:"checkpoint"`
			}
			json.Unmarshal(ev.Payload, &r)
			results[r.ToolCallID]++
			if r.Checkpoint != "" {
				checkpoints++ // strict: the step's checkpoint, named by its result
			}
		case "session.sandbox_restored":
			restores++
		case "session.checkpointed":
			checkpoints++
		}
	}
	once := true
	for _, n := range calls {
		once = once && n == 1
	}
	for _, n := range results {
		once = once && n == 1
	}
	d.check(len(calls) == 10 && once, "conversation: %d model answers and %d tool results, each recorded once (no answer requested again, no finished tool re-run)", len(calls), len(results))
	d.check(strings.HasPrefix(lastText, "Done:"), "the agent finished: %q", lastText)
	d.check(restores >= 2, "the sandbox was restored after each crash (%d restores)", restores)

	token2, n2 := d.counter(ctx, sbx)
	d.check(token2 == token1 && n2 > n1, "counter: the process kept its memory (token %s → %s) and went on counting (%d → %d)", token1, token2, n1, n2)
	var notes strings.Builder
	d.cl.ReadFile(ctx, sbx, "/root/notes.md", &notes)
	d.check(notes.String() == demoNotes, "files: /root/notes.md is as written")
	procs, _ := d.cl.Processes(ctx, sbx)
	var counterUp, serverUp bool
	for _, p := range procs {
		cmd := strings.Join(p.Args, " ")
		counterUp = counterUp || strings.Contains(cmd, "counter.py")
		serverUp = serverUp || strings.Contains(cmd, "http.server")
	}
	d.check(counterUp && serverUp, "processes: counter.py and the web server are running")
	var page strings.Builder
	st, err := d.cl.Exec(ctx, sbx, api.ExecRequest{Args: []string{"curl", "-s", "http://127.0.0.1:8000/notes.md"}}, nil, &page, io.Discard)
	d.check(err == nil && st.Code == 0 && page.String() == demoNotes, "the web server started before the crashes still serves the notes")

	items, retries := d.shop.Items(), d.shop.Deduplicated()
	d.check(strings.Join(items, ",") == "book,lamp,tea", "shop ledger: %v — each order exactly once (%d retried request answered from the shop's Idempotency-Key record)", items, retries)
	fx, err := d.cl.Effects(ctx, sbx)
	if err == nil {
		d.check(fx.NeedsReconciliation == 0, "effect journal: %d requests, none needing reconciliation", len(fx.Effects))
	}

	fmt.Fprintf(d.out, "\nReport (%d checkpoints, %d restores, %.0fs):\n", checkpoints, restores, time.Since(d.start).Seconds())
	failed := 0
	for _, c := range d.checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Fprintf(d.out, "  %s %s\n", mark, c.what)
	}
	if failed > 0 {
		d.keep = true
		return fmt.Errorf("%d of %d checks failed (data kept in %s)", failed, len(d.checks), d.dir)
	}
	fmt.Fprintf(d.out, "All %d checks hold.\n", len(d.checks))
	return nil
}

// cleanup removes the session's sandboxes, stops the daemon and removes
// the data dir (unless kept).
func (d *demo) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if d.daemon.Running() && d.cl != nil {
		if sbs, err := d.cl.ListSandboxes(ctx); err == nil {
			for _, sb := range sbs {
				if sb.State != "destroyed" {
					d.cl.DeleteSandbox(ctx, sb.ID)
				}
			}
		}
	}
	err := d.daemon.Stop()
	if d.keep {
		fmt.Fprintf(d.out, "data dir kept: %s\n", d.dir)
		return err
	}
	chaos.UnmountUnder(d.dir)
	os.RemoveAll(d.dir)
	return err
}
