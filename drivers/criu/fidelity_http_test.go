package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// Fidelity item 4 (in-flight requests) for the criu driver: an HTTP
// request from one process of the sandbox to an HTTP server in the same
// sandbox is pending at the cut, with half of the response already written
// to the connection; after a SIGKILL of the sandbox and a restore the
// client receives the whole response. Both sides hold a random value drawn
// at start and kept only in memory (the server's goes into the response
// body, the client's into the request path), so a restarted workload
// cannot pass for a restored one: the same check run against a fresh
// sandbox that was never restored must fail.
//
//	go test -tags seccomp -count=1 -run TestCheckpointHTTPInFlight -v ./drivers/criu

// httpServerPy serves one GET at a time on 127.0.0.1:8080. The response
// body is "<R> <path>\n" and 256 KiB of random bytes, R being drawn at
// start; the server logs the body's length and SHA-256, writes the headers
// and the first half, and writes the rest only once /root/http-go exists.
const httpServerPy = `
import hashlib, http.server, os, random, time
R = "%016x" % random.getrandbits(64)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        c = self.path.lstrip("/")
        body = ("%s %s\n" % (R, c)).encode() + os.urandom(256 << 10)
        print("got %s %d %s" % (c, len(body), hashlib.sha256(body).hexdigest()), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        half = len(body) // 2
        self.wfile.write(body[:half])
        print("half", flush=True)
        while not os.path.exists("/root/http-go"):
            time.sleep(0.05)
        self.wfile.write(body[half:])
        print("sent", flush=True)
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 8080), H)
print("ready %s" % R, flush=True)
srv.serve_forever()
`

// httpClientPy draws C, logs it, sends GET /<C> to the server (no proxy,
// no timeout) and, when the whole body has arrived, writes it to
// /root/http-resp and logs its length and SHA-256. It then sleeps, so that
// its PID can still be looked at.
const httpClientPy = `
import hashlib, os, random, time, urllib.request
C = "%016x" % random.getrandbits(64)
print("sending %s" % C, flush=True)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = opener.open("http://127.0.0.1:8080/" + C).read()
with open("/root/http-resp.tmp", "wb") as f:
    f.write(body)
os.rename("/root/http-resp.tmp", "/root/http-resp")
print("received %d %s" % (len(body), hashlib.sha256(body).hexdigest()), flush=True)
time.sleep(1000000)
`

// httpInFlight is the in-flight request of one sandbox as seen before the
// cut.
type httpInFlight struct {
	server, client int
	ticks          map[int]uint64 // server's and client's start ticks
	serverRnd      string         // R, from the server's "ready" line
	clientRnd      string         // C, from the client's "sending" line
	got            string         // the server's "got C <len> <sha256>" line
}

// fidelityPythonTemplate returns the python template (Debian with python3
// and sqlite3, scripts/setup/python-template.sh) or skips the test.
func fidelityPythonTemplate(t testing.TB) sandbox.Template {
	t.Helper()
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	m, _ := filepath.Glob(filepath.Join(cache, "templates", "python-*", "rootfs", "usr", "bin", "python3"))
	if len(m) == 0 {
		t.Skip("no python template (make setup)")
	}
	sort.Strings(m)
	return sandbox.Template{Name: "python", RootFS: filepath.Dir(filepath.Dir(filepath.Dir(m[len(m)-1])))}
}

// waitProcLog polls the log of the Start'ed process pid until it has a
// line starting with prefix and returns that line.
func waitProcLog(td *testDriver, id string, pid int, prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line in the log of %d after %v: %q", prefix, pid, timeout, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pidTicks returns the start ticks of pids in sandbox id (absent ones are
// left out).
func pidTicks(td *testDriver, id string, pids ...int) (map[int]uint64, error) {
	ps, err := td.Processes(context.Background(), id)
	if err != nil {
		return nil, err
	}
	m := map[int]uint64{}
	for _, p := range ps {
		for _, want := range pids {
			if p.PID == want {
				m[p.PID] = p.StartTicks
			}
		}
	}
	return m, nil
}

// responsePending reports an error when the client in sandbox id has
// received its response.
func responsePending(td *testDriver, id string) error {
	out, _, _ := td.run(id, "ls", "/root")
	if strings.Contains(out, "http-resp") {
		return fmt.Errorf("the response arrived before the trigger: %q", out)
	}
	return nil
}

// startHTTPInFlight starts the server and the client in sandbox id and
// returns once the request is in flight: the server has written half of
// the response and waits.
func startHTTPInFlight(t *testing.T, td *testDriver, id string) httpInFlight {
	t.Helper()
	ctx := context.Background()
	var h httpInFlight
	var err error
	if h.server, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", httpServerPy}}); err != nil {
		t.Fatal(err)
	}
	ready, err := waitProcLog(td, id, h.server, "ready ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h.serverRnd = strings.TrimPrefix(ready, "ready ")
	if h.client, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", httpClientPy}}); err != nil {
		t.Fatal(err)
	}
	sending, err := waitProcLog(td, id, h.client, "sending ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h.clientRnd = strings.TrimPrefix(sending, "sending ")
	if h.got, err = waitProcLog(td, id, h.server, "got "+h.clientRnd+" ", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := waitProcLog(td, id, h.server, "half", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if h.ticks, err = pidTicks(td, id, h.server, h.client); err != nil || len(h.ticks) != 2 {
		t.Fatalf("server %d and client %d: %v %v", h.server, h.client, h.ticks, err)
	}
	if err := responsePending(td, id); err != nil {
		t.Fatal(err)
	}
	return h
}

// errOtherRandom is the failure a fresh sandbox must show: the response
// carries other random values than the server's and the client's of
// before the cut.
var errOtherRandom = errors.New("not the server's and the client's in-memory random values of before the cut")

// httpCheck is the outcome of checkHTTPInFlight: procs says whether the
// server and the client are the processes of before, response whether the
// client received the whole response of before.
type httpCheck struct {
	procs, response error
}

// checkHTTPInFlight checks sandbox id against the in-flight request before
// seen before the cut: the server and the client have their PIDs and
// start ticks; the response has not arrived; once the server is let go,
// the client receives the whole body the server logged before the cut
// (length and SHA-256), which begins with the server's and the client's
// random values of before.
func checkHTTPInFlight(td *testDriver, id string, before httpInFlight) httpCheck {
	var c httpCheck
	now, err := pidTicks(td, id, before.server, before.client)
	if err != nil {
		return httpCheck{err, err}
	}
	if fmt.Sprint(now) != fmt.Sprint(before.ticks) {
		c.procs = fmt.Errorf("server and client (pid → start ticks) %v, want %v", now, before.ticks)
	}
	if c.response = responsePending(td, id); c.response != nil {
		return c
	}
	if out, errs, st := td.run(id, "touch", "/root/http-go"); st.Code != 0 {
		c.response = fmt.Errorf("touch: exit %d: %s %s", st.Code, out, errs)
		return c
	}
	// The client renames the response into place once all of it has
	// arrived. Nothing here goes by PID: a fresh sandbox's client fails on
	// what it received.
	recv, errs, st := td.run(id, "/bin/sh", "-c", `for i in $(seq 300); do [ -e /root/http-resp ] && break; sleep 0.1; done
head -n1 /root/http-resp; stat -c %s /root/http-resp; sha256sum < /root/http-resp`)
	if st.Code != 0 {
		c.response = fmt.Errorf("the client never got the response: exit %d: %s", st.Code, errs)
		return c
	}
	f := strings.Fields(recv)
	if len(f) != 5 {
		c.response = fmt.Errorf("response: %q", recv)
		return c
	}
	if got, want := f[0]+" "+f[1], before.serverRnd+" "+before.clientRnd; got != want {
		c.response = fmt.Errorf("%w: response begins %q, want %q", errOtherRandom, got, want)
		return c
	}
	// "got C <len> <sha>" against what the client wrote: all of it.
	if got, want := "got "+f[1]+" "+f[2]+" "+f[3], before.got; got != want {
		c.response = fmt.Errorf("the client received %q, the server was sending %q", got, want)
	}
	return c
}

// TestCheckpointHTTPInFlight is fidelity item 4 for the criu driver.
func TestCheckpointHTTPInFlight(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	tmpl := fidelityPythonTemplate(t)
	ctx := context.Background()
	start := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	id := newID("http")
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := td.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	before := startHTTPInFlight(t, td, id)
	lap("request in flight")
	t.Logf("before the cut: server %d R=%s, client %d C=%s, %s", before.server, before.serverRnd, before.client, before.clientRnd, before.got)

	images := t.TempDir()
	cs, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("checkpointed (frozen %v, memory %d B)", cs.Frozen, cs.MemoryBytes))
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if info, err := td.Inspect(ctx, id); err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("after kill: %+v %v", info, err)
	}
	rs, err := td.Restore(ctx, spec, images, sandbox.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("killed and restored (running after %v, %d connections restored, %d reset)", rs.Running, rs.ConnectionsRestored, rs.ConnectionsReset))
	if rs.ConnectionsRestored < 2 || rs.ConnectionsReset != 0 {
		t.Errorf("restore stats: %+v: the client's and the server's ends of the connection", rs)
	}
	c := checkHTTPInFlight(td, id, before)
	if c.procs != nil {
		t.Errorf("after restore: %v", c.procs)
	}
	if c.response != nil {
		t.Errorf("after restore: %v", c.response)
	}
	lap("checked")
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}

	// Control: the same workload in a sandbox never restored. The
	// response carries other random values, so the check must fail.
	ctl := newID("http-fresh")
	if _, err := td.Create(ctx, sandbox.Spec{ID: ctl, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	startHTTPInFlight(t, td, ctl)
	cc := checkHTTPInFlight(td, ctl, before)
	if !errors.Is(cc.response, errOtherRandom) {
		t.Errorf("the response check on a sandbox that was never restored: %v, want %v", cc.response, errOtherRandom)
	} else {
		t.Logf("on a fresh sandbox the response check fails as it must: %v", cc.response)
	}
	t.Logf("on a fresh sandbox the process check says: %v", cc.procs)
	if err := td.Destroy(ctx, ctl); err != nil {
		t.Fatal(err)
	}
	lap("control checked")
}
