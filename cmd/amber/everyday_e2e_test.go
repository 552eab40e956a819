package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestE2EEverydayCLI: the CLI's everyday calls (issue 22 §2) against a
// daemon whose sandboxes go idle after 2 s: exec -c runs a shell command
// line, a missing program exits 127 at once, a bad env entry is refused,
// exec -d --stdin and `amber stdin` feed a background process whose output
// `amber logs` reads from an offset and follows, ps shows none of Amber's
// own processes, and exec wakes a sandbox stopped for being idle.
func TestE2EEverydayCLI(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0", "--idle-timeout", "2s")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))

	if out := d.must("exec", id, "-c", "echo one two three | wc -w"); strings.TrimSpace(out) != "3" {
		t.Fatalf("exec -c: %q", out)
	}
	if _, errs, code := d.amber("exec", id, "-c", "exit 6"); code != 6 {
		t.Fatalf("exec -c 'exit 6': exit %d %s", code, errs)
	}
	start := time.Now()
	if _, errs, code := d.amber("exec", id, "--", "no-such-program"); code != 127 || errs == "" {
		t.Fatalf("a missing program: exit %d, stderr %q; want 127 and a reason", code, errs)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a missing program took %s to report", took)
	}
	if _, errs, code := d.amber("exec", id, "-e", "NOEQUALS", "--", "true"); code == 0 || !strings.Contains(errs, "KEY=VALUE") {
		t.Errorf("a bad env entry: exit %d, stderr %q", code, errs)
	}

	pid := strings.TrimSpace(d.must("exec", "-d", "--stdin", id, "-c", `while read l; do echo "got:$l"; done`))
	if out, errs, code := d.amberIn("a\n", "stdin", id, pid); code != 0 {
		t.Fatalf("amber stdin: %d %s %s", code, out, errs)
	}
	if out, errs, code := d.amberIn("b\n", "stdin", "--close", id, pid); code != 0 {
		t.Fatalf("amber stdin --close: %d %s %s", code, out, errs)
	}
	if out := d.must("logs", "-f", id, pid); out != "got:a\ngot:b\n" {
		t.Fatalf("logs -f: %q", out)
	}
	if out := d.must("logs", "--offset", "6", id, pid); out != "got:b\n" {
		t.Fatalf("logs --offset 6: %q", out)
	}
	if out := d.must("wait", id, pid); out != "exit 0\n" {
		t.Fatalf("wait: %q", out)
	}
	d.must("exec", "-d", id, "--", "sleep", "600")
	for _, line := range strings.Split(strings.TrimSpace(d.must("ps", "--json", id)), "\n") {
		var p struct {
			PID  int      `json:"pid"`
			Args []string `json:"args"`
		}
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatalf("ps --json line %q: %v", line, err)
		}
		if p.PID == 1 || strings.Contains(strings.Join(p.Args, " "), "amber") {
			t.Errorf("ps shows Amber's own process %+v", p)
		}
	}

	// Idle: checkpointed and stopped; the next exec resumes it.
	deadline := time.Now().Add(time.Minute)
	for {
		var sb struct{ State, Reason string }
		if err := json.Unmarshal([]byte(d.must("sandbox", "inspect", "--json", id)), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.State == "stopped" && strings.HasPrefix(sb.Reason, "idle") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not stopped idle after a minute: %+v", sb)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := d.must("exec", id, "-c", "echo awake"); out != "awake\n" {
		t.Fatalf("exec on an idle sandbox: %q", out)
	}
}
