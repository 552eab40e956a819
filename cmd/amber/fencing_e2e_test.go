package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/chaos"
)

// TestE2EFencingPausedDaemon: a daemon paused (SIGSTOP) right before it
// appends a step, commits a checkpoint or forwards an effect loses its
// data-dir lease; a daemon started with --take-over fences it and finishes
// the session; resumed (SIGCONT), the old daemon writes nothing — no event,
// no checkpoint pointer, no request to the shop — and exits with status 75.
// The pause is a failpoint (stop-self), so it lands exactly before the
// write each case is about. SIGSTOP stops every thread, so now and then A
// stops inside another goroutine's SQLite write and keeps a database
// locked: B then ends A (SIGKILL, internal/host/takeover) once the lock outlasts the
// lease, and A has written nothing either.
func TestE2EFencingPausedDaemon(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	cases := []struct{ name, spec string }{
		// The model's 2nd answer arrived; it is not appended yet.
		{"append", "session.model.before-record=2:stop-self"},
		// The sandbox's first checkpoint (the 1st manifest is the template
		// version's): chunks and manifest durable, commit hook not run.
		{"checkpoint", "chunkstore.manifest=2:stop-self"},
		// The order's intent is durable; the request has not gone out.
		{"forward", "gateway.before-send=1:stop-self"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fencingCase(t, c.spec, c.name == "forward")
		})
	}
}

// fencingCase pauses daemon A at spec, lets daemon B take over, then
// resumes A. Normally B finishes the session before A resumes. With
// forwardOnly, A is resumed as soon as B took over: B cannot restore the
// sandbox while A (stopped) still holds the port of its egress listener
// (a known limit of taking over from a live process; see
// docs/ARCHITECTURE.md), so B cannot have sent the order either — the
// shop must have seen nothing when A exits.
func fencingCase(t *testing.T, spec string, forwardOnly bool) {
	bin, dir := e2eSetup(t)
	sh, err := chaos.StartShop("")
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	fplog := filepath.Join(dir, "failpoints.log")
	args := []string{"--pool", "0", "--lease-ttl", "2s",
		"--egress-host", "shop.test=127.0.0.1", "--egress-allow", fmt.Sprintf("shop.test:%d", sh.Port)}
	a := startDaemonEnv(t, bin, dir, freeAddr(t), []string{"AMBER_TEST_FAILPOINTS=" + spec, "AMBER_TEST_FAILPOINT_LOG=" + fplog}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	clA := fencingClient(t, dir, a.addr)
	call := func(name string, input map[string]any) map[string]any {
		return map[string]any{"name": name, "input": input}
	}
	script := []map[string]any{
		{"tool_calls": []any{call("write_file", map[string]any{"path": "/root/a.txt", "content": "one\n"})}},
		{"tool_calls": []any{call("http", map[string]any{"method": "POST",
			"url": fmt.Sprintf("http://shop.test:%d/orders", sh.Port), "headers": map[string]string{"Content-Type": "application/json"},
			"body": `{"item":"book","qty":1}`})}},
		{"tool_calls": []any{call("bash", map[string]any{"command": "cat /root/a.txt"})}},
		map[string]any{"text": "done"},
	}
	se, err := clA.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted", "script": script},
		"template": "python", "policy": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clA.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "go", Payload: json.RawMessage(`{"text":"go"}`)}); err != nil {
		t.Fatal(err)
	}
	// A stops itself at the point.
	waitFor(t, 4*time.Minute, "daemon A to stop at "+spec, func() bool {
		b, _ := os.ReadFile(fplog)
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.pid))
		f := strings.Fields(string(st))
		return strings.Contains(string(b), "stop-self") && len(f) > 2 && f[2] == "T"
	})
	// B takes the data dir over (after A's 2 s lease expired) and finishes.
	bArgs := append(append([]string{}, args...), "--take-over")
	if forwardOnly {
		// B may not reach the shop: an order the shop sees can only be A's
		// (B would otherwise re-run the order legitimately the moment A's
		// exit frees the egress listener, before the test looks).
		bArgs = []string{"--pool", "0", "--lease-ttl", "2s", "--take-over"}
	}
	b := startDaemonEnv(t, bin, dir, freeAddr(t), nil, bArgs...)
	if !strings.Contains(b.log(), "took the data dir over") {
		t.Fatalf("B did not say it took over:\n%s", tail(b.log(), 20))
	}
	clB := fencingClient(t, dir, b.addr)
	if forwardOnly {
		if o := strings.Join(sh.Items(), ","); o != "" {
			t.Fatalf("the shop saw orders %q before A resumed (A stopped before sending)", o)
		}
		resume(t, a)
		select {
		case <-a.exited:
		case <-time.After(2 * time.Minute):
			t.Fatalf("A did not exit within 2 minutes of SIGCONT\n%s", tail(quiet(a.log()), 30))
		}
		orders, dedup := strings.Join(sh.Items(), ","), sh.Deduplicated()
		checkFencedExit(t, a, b)
		if orders != "" || dedup != 0 {
			t.Fatalf("the shop saw orders %q (%d repeated keys) when A exited: A forwarded after it was fenced\nA:\n%s\nB:\n%s", orders, dedup, tail(quiet(a.log()), 40), tail(quiet(b.log()), 40))
		}
		return
	}
	want := len(script)
	waitForOr(t, 5*time.Minute, "the session to finish on daemon B", func() string { return "A:\n" + tail(quiet(a.log()), 30) + "\nB:\n" + tail(quiet(b.log()), 60) }, func() bool {
		l, err := clB.SessionEvents(ctx, se.ID, 0, 1000)
		if err != nil {
			return false
		}
		n, status := 0, ""
		for _, ev := range l.Events {
			switch ev.Type {
			case "session.assistant_message":
				n++
			case "session.status":
				var s struct{ Status string }
				json.Unmarshal(ev.Payload, &s)
				status = s.Status
			}
		}
		return n >= want && status == "idle"
	})
	before := fencingSnapshot(t, ctx, clB, dir, se.ID, sh)
	// (B may not reach the shop: A, stopped, may still hold the sandbox's
	// egress listener when B restores it; the order then fails and the
	// session goes on. Either way it is not booked twice.)
	if strings.Count(before.orders, "book") > 1 {
		t.Fatalf("the shop booked %q before A resumed", before.orders)
	}

	// A resumes: it must find itself fenced before writing anything.
	resume(t, a)
	select {
	case <-a.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("A did not exit within 2 minutes of SIGCONT\n%s", tail(a.log(), 30))
	}
	checkFencedExit(t, a, b)
	time.Sleep(time.Second)
	after := fencingSnapshot(t, ctx, clB, dir, se.ID, sh)
	if after.events != before.events {
		t.Errorf("the session log changed after A resumed:\nbefore %s\nafter  %s", before.events, after.events)
	}
	if after.pointers != before.pointers {
		t.Errorf("checkpoint pointers changed after A resumed:\nbefore %s\nafter  %s", before.pointers, after.pointers)
	}
	if after.orders != before.orders || after.dedup != 0 {
		t.Errorf("the shop saw more after A resumed: orders %q → %q, repeated keys %d (A forwarded)", before.orders, after.orders, after.dedup)
	}
	if sbs, err := clB.ListSandboxes(ctx); err == nil {
		for _, sb := range sbs {
			clB.DeleteSandbox(ctx, sb.ID)
		}
	}
}

// resume SIGCONTs A unless B has ended it already.
func resume(t *testing.T, a *daemon) {
	t.Helper()
	select {
	case <-a.exited:
		return
	default:
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		select {
		case <-a.exited:
		case <-time.After(5 * time.Second):
			t.Fatal(err)
		}
	}
}

// checkFencedExit: A exited with status 75 after saying it was fenced, or
// (stopped inside an SQLite write) was ended by B, which said so.
func checkFencedExit(t *testing.T, a, b *daemon) {
	t.Helper()
	if ws, ok := a.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL &&
		strings.Contains(b.log(), "holds a database lock past its lease") {
		t.Logf("A was stopped inside a database write; B ended it")
		return
	}
	if code := a.cmd.ProcessState.ExitCode(); code != exitFenced || !strings.Contains(a.log(), "fenced: another daemon took this data dir over") {
		t.Fatalf("A exited with %v, want status %d after saying it was fenced\n%s", a.cmd.ProcessState, exitFenced, tail(quiet(a.log()), 30))
	}
}

type fencingSnap struct {
	events, pointers, orders string
	dedup                    int
}

func fencingSnapshot(t *testing.T, ctx context.Context, cl *client.Client, dir, session string, sh *chaos.Shop) fencingSnap {
	t.Helper()
	l, err := cl.SessionEvents(ctx, session, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, ev := range l.Events {
		evs = append(evs, fmt.Sprintf("%d:%s", ev.Seq, ev.ID))
	}
	ptrs, _ := filepath.Glob(filepath.Join(dir, "blobs", "tenants", "*", "checkpoints", "*", "COMMITTED"))
	sort.Strings(ptrs)
	return fencingSnap{events: strings.Join(evs, " "), pointers: strings.Join(ptrs, " "), orders: strings.Join(sh.Items(), ","), dedup: sh.Deduplicated()}
}

func fencingClient(t *testing.T, dir, addr string) *client.Client {
	t.Helper()
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New("http://"+addr, strings.TrimSpace(string(key)))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	waitForOr(t, d, what, func() string { return "" }, ok)
}

// waitForOr is waitFor that adds diag() to the failure.
func waitForOr(t *testing.T, d time.Duration, what string, diag func() string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s\n%s", d, what, diag())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// quiet drops the API's access-log lines from a daemon log.
func quiet(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "msg=request ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
