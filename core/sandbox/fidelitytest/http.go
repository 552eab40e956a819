package fidelitytest

// Fidelity item 4 (in-flight requests), in the default test run of both
// drivers: an HTTP request from one process of the sandbox to an HTTP
// server in the same sandbox is pending at the cut, with half of the
// response already written to the connection; after a SIGKILL of the
// sandbox and a restore the client receives the whole response. Both sides
// hold a random value drawn at start and kept only in memory (the server's
// goes into the response body, the client's into the request path), so a
// restarted workload cannot pass for a restored one: the same check run
// against a fresh sandbox that was never restored must fail.

import (
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

// PythonTemplate returns the python template (Debian with python3 and
// sqlite3, scripts/setup/python-template.sh) or skips the test.
func PythonTemplate(t testing.TB) sandbox.Template {
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
	root := filepath.Dir(filepath.Dir(filepath.Dir(m[len(m)-1])))
	return sandbox.Template{Name: "python", Version: filepath.Base(filepath.Dir(root)), RootFS: root}
}

// waitLog polls the log of the Start'ed process pid until it has a line
// starting with prefix and returns that line.
func waitLog(d Driver, id string, pid int, prefix string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out := procLog(d, id, pid)
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

// startHTTPInFlight starts the server and the client in sandbox id and
// returns once the request is in flight: the server has written half of
// the response and waits.
func startHTTPInFlight(t *testing.T, d Driver, id string) httpInFlight {
	t.Helper()
	var h httpInFlight
	var err error
	h.server = start(t, d, id, "python3", "-c", httpServerPy)
	ready, err := waitLog(d, id, h.server, "ready ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h.serverRnd = strings.TrimPrefix(ready, "ready ")
	h.client = start(t, d, id, "python3", "-c", httpClientPy)
	sending, err := waitLog(d, id, h.client, "sending ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h.clientRnd = strings.TrimPrefix(sending, "sending ")
	if h.got, err = waitLog(d, id, h.server, "got "+h.clientRnd+" ", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := waitLog(d, id, h.server, "half", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if h.ticks, err = ticks(d, id, h.server, h.client); err != nil || len(h.ticks) != 2 {
		t.Fatalf("server %d and client %d: %v %v", h.server, h.client, h.ticks, err)
	}
	// Pending: the client has not had the response.
	if out := mustSh(t, d, id, fmt.Sprintf("cat /run/amber/proc/%d.log; ls /root", h.client)); strings.Contains(out, "received") || strings.Contains(out, "http-resp") {
		t.Fatalf("the response arrived before the trigger: %q", out)
	}
	return h
}

// errOtherRandom is the failure a fresh sandbox must show: the response
// carries other random values than the server's and the client's of
// before the cut.
var errOtherRandom = errors.New("not the server's and the client's in-memory random values of before the cut")

// checkHTTPInFlight checks sandbox id against the in-flight request seen
// before the cut: the server and the client have their PIDs and start
// ticks (procs); once the server is let go, the client receives the whole
// body the server logged before the cut (length and SHA-256), which begins
// with the server's and the client's random values of before (response).
func checkHTTPInFlight(d Driver, id string, before httpInFlight) (procs, response error) {
	now, err := ticks(d, id, before.server, before.client)
	if err != nil {
		return err, err
	}
	if fmt.Sprint(now) != fmt.Sprint(before.ticks) {
		procs = fmt.Errorf("server and client (pid → start ticks) %v, want %v", now, before.ticks)
	}
	if out, err := sh(d, id, "ls /root", time.Minute); err != nil || strings.Contains(out, "http-resp") {
		return procs, fmt.Errorf("the response arrived before the trigger (or no listing): %q %v", out, err)
	}
	if _, err := sh(d, id, "touch /root/http-go", time.Minute); err != nil {
		return procs, err
	}
	// The client renames the response into place once all of it has
	// arrived. Nothing here goes by PID: a fresh sandbox's client fails on
	// what it received.
	recv, err := sh(d, id, `for i in $(seq 300); do [ -e /root/http-resp ] && break; sleep 0.1; done
head -n1 /root/http-resp; stat -c %s /root/http-resp; sha256sum < /root/http-resp`, 2*time.Minute)
	if err != nil {
		return procs, fmt.Errorf("the client never got the response: %v", err)
	}
	f := strings.Fields(recv)
	if len(f) != 5 {
		return procs, fmt.Errorf("response: %q", recv)
	}
	if got, want := f[0]+" "+f[1], before.serverRnd+" "+before.clientRnd; got != want {
		return procs, fmt.Errorf("%w: response begins %q, want %q", errOtherRandom, got, want)
	}
	// "got C <len> <sha>" against what the client wrote: all of it.
	if got, want := "got "+f[1]+" "+f[2]+" "+f[3], before.got; got != want {
		return procs, fmt.Errorf("the client received %q, the server was sending %q", got, want)
	}
	return procs, nil
}

// HTTPOptions tune HTTPInFlight.
type HTTPOptions struct {
	// NoReset requires the restore to report no connection reset (the
	// criu driver restores established TCP; gvisor counts none).
	NoReset bool
}

// HTTPInFlight is fidelity item 4: see the top of this file.
func HTTPInFlight(t *testing.T, d Driver, tmpl sandbox.Template, o HTTPOptions) {
	lap := lapper(t)
	spec := create(t, d, "http", tmpl)
	before := startHTTPInFlight(t, d, spec.ID)
	lap("request in flight")
	t.Logf("before the cut: server %d R=%s, client %d C=%s, %s", before.server, before.serverRnd, before.client, before.clientRnd, before.got)
	rs, err := cut(t, d, spec, lap)
	if err != nil {
		t.Fatal(err)
	}
	if rs.ConnectionsRestored < 2 || (o.NoReset && rs.ConnectionsReset != 0) {
		t.Errorf("restore stats: %+v: want the client's and the server's ends of the connection restored", rs)
	}
	procs, response := checkHTTPInFlight(d, spec.ID, before)
	if procs != nil {
		t.Errorf("after restore: %v", procs)
	}
	if response != nil {
		t.Errorf("after restore: %v", response)
	}
	lap("checked")

	// Control: the same workload in a sandbox never restored. The
	// response carries other random values, so the check must fail.
	ctl := create(t, d, "http-fresh", tmpl)
	startHTTPInFlight(t, d, ctl.ID)
	cprocs, cresponse := checkHTTPInFlight(d, ctl.ID, before)
	if !errors.Is(cresponse, errOtherRandom) {
		t.Errorf("the response check on a sandbox that was never restored: %v, want %v", cresponse, errOtherRandom)
	} else {
		t.Logf("on a fresh sandbox the response check fails as it must: %v", cresponse)
	}
	t.Logf("on a fresh sandbox the process check says: %v", cprocs)
	lap("control checked")
}
