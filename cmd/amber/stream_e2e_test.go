package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// streamScript keeps one TCP connection to echo.test open, one line every
// 200 ms, and logs each echo; on any failure it logs ERR/EOF and exits.
const streamScript = `import socket, sys, time
s = socket.create_connection(("echo.test", int(sys.argv[1])), timeout=10)
s.settimeout(20)
out = open("/root/stream.log", "a", buffering=1)
i = 0
while True:
    i += 1
    try:
        s.sendall(b"ping %d\n" % i)
        data = s.recv(100)
        if not data:
            out.write("EOF\n")
            break
        out.write(data.decode())
    except Exception as e:
        out.write("ERR %s\n" % type(e).__name__)
        break
    time.sleep(0.2)
`

// TestE2EStreamAcrossRestore: a TCP connection from a sandbox to an outside
// server, through the gateway. A planned checkpoint-and-stop and a restore
// of that cut keep it: the program goes on, the server sees no disconnect.
// A crash (kill) resets it: the server sees it close at once, and after
// the recover the program gets a clean error, not a hang.
func TestE2EStreamAcrossRestore(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	bin, dir := e2eSetup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted, closed atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				io.Copy(c, c)
				c.Close()
				closed.Add(1)
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0", "--egress-host", "echo.test=127.0.0.1")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "python", "--egress-allow", fmt.Sprintf("echo.test:%d", port)))
	if out, errs, code := d.amberIn(streamScript, "files", "put", id, "-", "/root/stream.py"); code != 0 {
		t.Fatalf("files put: %s %s", out, errs)
	}
	d.must("exec", "-d", id, "--", "python3", "/root/stream.py", fmt.Sprint(port))
	pings := func() (n int, tailLine string) {
		out, _, _ := d.amber("exec", id, "--", "cat", "/root/stream.log")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		for _, l := range lines {
			if strings.HasPrefix(l, "ping ") {
				n++
			}
		}
		return n, lines[len(lines)-1]
	}
	waitPings := func(what string, more int) int {
		t.Helper()
		n0, _ := pings()
		deadline := time.Now().Add(30 * time.Second)
		for {
			n, last := pings()
			if strings.HasPrefix(last, "ERR") || strings.HasPrefix(last, "EOF") {
				t.Fatalf("%s: the stream broke: %q\n%s", what, last, grepLog(d.log(), "egress|restore|checkpoint"))
			}
			if n >= n0+more {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d pings, want %d more than %d", what, n, more, n0)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitPings("before the cut", 3)

	// Planned: checkpoint --stop, then restore that cut in place.
	var ck struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(d.must("checkpoint", "--stop", "--json", id)), &ck); err != nil {
		t.Fatal(err)
	}
	d.must("restore", ck.ID)
	waitPings("after the planned restore", 5)
	if a, c := accepted.Load(), closed.Load(); a != 1 || c != 0 {
		t.Fatalf("outside server: %d connections accepted, %d closed; want 1 and 0 (no disconnect)", a, c)
	}

	// Crash: kill; the outside sees the connection close.
	d.must("sandbox", "kill", id)
	deadline := time.Now().Add(15 * time.Second)
	for closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the outside server never saw the killed sandbox's connection close")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.must("sandbox", "recover", id)
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, last := pings()
		if strings.HasPrefix(last, "ERR") || strings.HasPrefix(last, "EOF") {
			t.Logf("after the crash and recover the program saw %q", last)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the crash and recover the program still waits on its connection (last line %q)", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.must("sandbox", "rm", id)
}

// grepLog returns the lines of log matching any of the |-separated words.
func grepLog(log, words string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for _, w := range strings.Split(words, "|") {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
