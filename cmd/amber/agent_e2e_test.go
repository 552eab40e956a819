package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EPlainExecSurvivesRecover: what a plain `amber exec` leaves running
// — a server started with nohup and &, a program that daemonizes itself
// (double fork, setsid), and a process tree three deep — is checkpointed
// and comes back with the restore, through a kill and a new daemon process:
// every process with its PID and start time, the server answering. And a
// background process's output re-attaches from the offset the client had,
// without a gap or a repeat (`amber logs --offset`).
func TestE2EPlainExecSurvivesRecover(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "sh", "-c", "mkdir -p /www && echo plain-exec > /www/index.html")
	// (The minimal template's busybox has no nohup: a plain & and setsid.)
	d.must("exec", id, "--", "sh", "-c", "httpd -f -p 127.0.0.1:8080 -h /www >/dev/null 2>&1 &")
	d.must("exec", id, "--", "sh", "-c", `(setsid sleep 100001 </dev/null >/dev/null 2>&1 &) ; exit 0`)
	d.must("exec", id, "--", "sh", "-c", `sh -c 'sh -c "sleep 100002; true" & wait' >/dev/null 2>&1 &`)
	counter := strings.TrimSpace(d.must("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo "n $i"; sleep 0.02; done`))

	type proc struct {
		PID        int      `json:"pid"`
		PPID       int      `json:"ppid"`
		Args       []string `json:"args"`
		StartTicks uint64   `json:"start_ticks"`
	}
	procs := func() map[int]proc {
		t.Helper()
		out := d.must("--json", "ps", id)
		m := map[int]proc{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var p proc
			if err := json.Unmarshal([]byte(line), &p); err != nil {
				t.Fatalf("ps --json: %q: %v", line, err)
			}
			m[p.PID] = p
		}
		return m
	}
	// is: the process runs what (its whole command line, or its program
	// and arguments that follow), not a shell that mentions it.
	is := func(p proc, what string) bool {
		j := strings.Join(p.Args, " ")
		return j == what || strings.HasPrefix(j, what+" ")
	}
	find := func(m map[int]proc, what string) proc {
		t.Helper()
		for _, p := range m {
			if is(p, what) {
				return p
			}
		}
		t.Fatalf("no process %q among %v", what, m)
		return proc{}
	}
	var before map[int]proc
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		before = procs()
		ok := 0
		for _, w := range []string{"httpd", "sleep 100001", "sleep 100002"} {
			for _, p := range before {
				if is(p, w) {
					ok++
					break
				}
			}
		}
		if ok == 3 || time.Now().After(deadline) {
			break
		}
	}
	deep := find(before, "sleep 100002")
	if mid, ok := before[deep.PPID]; !ok || mid.PPID <= 1 {
		t.Errorf("the three-deep tree is not three deep: %+v under %+v", deep, mid)
	}
	for _, p := range before {
		if strings.Contains(strings.Join(p.Args, " "), "amber-agent") {
			t.Errorf("ps lists the agent: %+v", p)
		}
	}
	if deep.PPID == 0 {
		t.Fatalf("the three-deep tree: %+v", deep)
	}
	page := func() string {
		out, _, _ := d.amber("exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/")
		return out
	}
	if got := page(); got != "plain-exec\n" {
		t.Fatalf("the server before the checkpoint: %q", got)
	}
	// The output so far, and its offset.
	logs := func(offset int64) (string, int64) {
		t.Helper()
		out := d.must("--json", "logs", "--offset", strconv.FormatInt(offset, 10), id, counter)
		var data strings.Builder
		next := offset
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var f struct {
				Stream string `json:"stream"`
				Offset int64  `json:"offset"`
				Data   []byte `json:"data"`
			}
			if err := json.Unmarshal([]byte(line), &f); err != nil {
				t.Fatalf("logs --json: %q: %v", line, err)
			}
			if f.Stream != "stdout" {
				t.Fatalf("logs frame %q at %d", f.Stream, f.Offset)
			}
			if f.Offset != next {
				t.Fatalf("logs: a frame at %d after %d", f.Offset, next)
			}
			data.Write(f.Data)
			next += int64(len(f.Data))
		}
		return data.String(), next
	}
	time.Sleep(200 * time.Millisecond)
	seen, off := logs(0)

	d.must("checkpoint", id)
	d.must("sandbox", "kill", id)
	d.stop(syscall.SIGTERM)
	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	d.must("sandbox", "recover", id)

	after := procs()
	for _, w := range []string{"httpd", "sleep 100001", "sleep 100002"} {
		b, a := find(before, w), find(after, w)
		if a.PID != b.PID || a.StartTicks != b.StartTicks {
			t.Errorf("%s: pid %d (start %d) before, %d (start %d) after the recover", w, b.PID, b.StartTicks, a.PID, a.StartTicks)
		}
	}
	if got := page(); got != "plain-exec\n" {
		t.Errorf("the server after the recover: %q\n%s", got, tail(d.log(), 20))
	}
	// From the offset the client had: the lines go on where they stopped.
	more, _ := logs(off)
	all := seen + more
	lines := strings.Split(strings.TrimSuffix(all, "\n"), "\n")
	for i, l := range lines {
		if l != fmt.Sprintf("n %d", i+1) {
			t.Fatalf("output line %d is %q: a gap or a repeat around the re-attach at byte %d", i+1, l, off)
		}
	}
	if len(lines) < 3 {
		t.Fatalf("too little output: %q", all)
	}
}
