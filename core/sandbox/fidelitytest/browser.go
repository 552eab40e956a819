package fidelitytest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// Fidelity item 5 (browser sessions): headless Chromium in the sandbox has
// a page open, served by a small HTTP server on the sandbox's loopback. The
// page's JavaScript draws a random token into a variable, counts in another
// one with setInterval, and stores a random value in localStorage and
// another in a cookie. A DevTools client inside the sandbox (python, stdlib
// only, over --remote-debugging-port on 127.0.0.1) reads all of it before
// the cut and after the restore.

// siteDir is where the page is served from, inside the sandbox.
const siteDir = "/root/site"

// pageHTML is the page under test. amberToken is drawn at load and lives
// only in the page's memory; amberCounter counts every 100 ms; the
// localStorage item and the cookie are drawn once per profile.
const pageHTML = `<!doctype html>
<html><head><title>amber</title></head><body>
<script>
function rnd() {
  const a = new Uint8Array(8);
  crypto.getRandomValues(a);
  return Array.from(a, b => b.toString(16).padStart(2, "0")).join("");
}
window.amberToken = rnd();
window.amberCounter = 0;
setInterval(() => { window.amberCounter++; }, 100);
if (!localStorage.getItem("amber")) localStorage.setItem("amber", rnd());
if (!document.cookie.includes("amber=")) document.cookie = "amber=" + rnd() + "; max-age=86400; path=/";
document.body.textContent = "ready";
</script>
</body></html>
`

// pageURL is the page's address inside the sandbox.
const pageURL = "http://127.0.0.1:8000/index.html"

// devtoolsPort is Chromium's remote debugging port on the sandbox's loopback.
const devtoolsPort = 9222

// chromiumArgs start headless Chromium on url. --no-sandbox: the sandbox
// is the isolation (Chromium's own needs user namespaces);
// --disable-dev-shm-usage: shared memory in /tmp, not a small /dev/shm; the
// rest keeps it from reaching for networks and services it cannot have.
func chromiumArgs(url string) []string {
	return []string{
		"chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-breakpad", "--disable-sync",
		"--disable-background-networking", "--disable-component-update", "--password-store=basic",
		"--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
		"--user-data-dir=/root/chrome-profile",
		"--remote-debugging-address=127.0.0.1", fmt.Sprintf("--remote-debugging-port=%d", devtoolsPort),
		url,
	}
}

// devtoolsPy is the DevTools client (a minimal RFC 6455 WebSocket client,
// no Origin header), run as `python3 -c devtoolsPy MODE URL PORT`:
//
//	state URL  find the page target at URL in /json/list and print one JSON
//	           object: the target id, the page's state as its JavaScript
//	           sees it, and the cookies the browser holds for the page
//	close -    print the URLs of the open pages (JSON list), then close the
//	           browser (Browser.close: Chromium writes its profile out)
//	open URL   open a new page on URL (PUT /json/new)
const devtoolsPy = `
import base64, json, os, socket, struct, sys, urllib.parse, urllib.request

mode, url, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def http(path, method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    return json.load(opener.open(req, timeout=20))

class WS:
    def __init__(self, ws_url):
        hostport, path = ws_url[len("ws://"):].split("/", 1)
        host, p = hostport.rsplit(":", 1)
        self.s = socket.create_connection((host, int(p)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, hostport, key)).encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            d = self.s.recv(4096)
            if not d:
                raise EOFError("websocket handshake")
            self.buf += d
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("websocket handshake: %r" % head)
        self.n = 0

    def read(self, n):
        while len(self.buf) < n:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("websocket closed")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, obj):
        data = json.dumps(obj).encode()
        n = len(data)
        if n < 126:
            hdr = struct.pack(">BB", 0x81, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack(">BBH", 0x81, 0x80 | 126, n)
        else:
            hdr = struct.pack(">BBQ", 0x81, 0x80 | 127, n)
        mask = os.urandom(4)
        self.s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        msg = b""
        while True:
            b0, b1 = self.read(2)
            n = b1 & 0x7f
            if n == 126:
                n = struct.unpack(">H", self.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.read(8))[0]
            payload = self.read(n)
            op = b0 & 0x0f
            if op == 8:
                raise EOFError("websocket closed by the browser")
            if op in (9, 10):
                continue
            msg += payload
            if b0 & 0x80:
                return json.loads(msg)

    def call(self, method, **params):
        self.n += 1
        self.send({"id": self.n, "method": method, "params": params})
        while True:
            m = self.recv()
            if m.get("id") == self.n:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]

if mode == "close":
    print(json.dumps([t["url"] for t in http("/json/list") if t.get("type") == "page"]))
    sys.stdout.flush()
    WS(http("/json/version")["webSocketDebuggerUrl"]).call("Browser.close")
    sys.exit(0)
if mode == "open":
    print(json.dumps(http("/json/new?" + urllib.parse.quote(url, safe=""), method="PUT")["id"]))
    sys.exit(0)

targets = http("/json/list")
pages = [t for t in targets if t.get("type") == "page" and t.get("url") == url]
if not pages:
    sys.exit("no page %s among %s" % (url, [t.get("url") for t in targets]))
target = pages[0]
ws = WS(target["webSocketDebuggerUrl"])
expr = ("JSON.stringify({token: window.amberToken, counter: window.amberCounter, "
        "storage: localStorage.getItem('amber'), cookie: document.cookie})")
r = ws.call("Runtime.evaluate", expression=expr, returnByValue=True)
if "exceptionDetails" in r:
    sys.exit("evaluate: %s" % r["exceptionDetails"])
page = json.loads(r["result"]["value"])
cookies = ws.call("Network.getCookies", urls=[url])["cookies"]
print(json.dumps({"target": target["id"], "page": page,
                  "cookies": {c["name"]: c["value"] for c in cookies}}))
`

// devtools runs devtoolsPy in sandbox id and returns what it printed.
func devtools(d Driver, id, mode, url string) (string, error) {
	out, err := sh(d, id, fmt.Sprintf("python3 -c '%s' %s '%s' %d", strings.ReplaceAll(devtoolsPy, "'", `'\''`), mode, url, devtoolsPort), time.Minute)
	if err != nil {
		return out, fmt.Errorf("devtools %s: %v", mode, err)
	}
	return out, nil
}

// browserState is one reading of the browser by devtoolsPy.
type browserState struct {
	Target string `json:"target"`
	Page   struct {
		Token   string `json:"token"`
		Counter int64  `json:"counter"`
		Storage string `json:"storage"`
		Cookie  string `json:"cookie"` // document.cookie
	} `json:"page"`
	Cookies map[string]string `json:"cookies"` // the browser's cookie jar for the page
}

// readBrowser reads the browser in sandbox id through DevTools.
func readBrowser(d Driver, id string) (browserState, error) {
	var s browserState
	out, err := devtools(d, id, "state", pageURL)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &s); err != nil {
		return s, fmt.Errorf("devtools output %q: %v", out, err)
	}
	return s, nil
}

// browserRun is the browser workload of one sandbox as seen before the cut.
type browserRun struct {
	server, browser int
	ticks           map[int]uint64
	state           browserState
}

// startBrowser starts the HTTP server and Chromium in sandbox id and
// returns once the page has run its script and counted a few times.
func startBrowser(t *testing.T, d Driver, id string, opts BrowserOptions) browserRun {
	t.Helper()
	mustSh(t, d, id, fmt.Sprintf("mkdir -p %s && cat > %s/index.html <<'EOF'\n%sEOF", siteDir, siteDir, pageHTML))
	var r browserRun
	r.server = start(t, d, id, "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", siteDir)
	r.browser = startEnv(t, d, id, opts.ChromiumEnv, chromiumArgs(pageURL)...)
	r.state = waitPage(t, d, id, r.browser)
	var err error
	if r.ticks, err = ticks(d, id, r.server, r.browser); err != nil || len(r.ticks) != 2 {
		t.Fatalf("server %d and chromium %d in %s: %v %v", r.server, r.browser, id, r.ticks, err)
	}
	return r
}

// waitPage waits until the page in sandbox id has run its script and
// counted a few times, and returns its state.
func waitPage(t *testing.T, d Driver, id string, browser int) browserState {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := readBrowser(d, id)
		if err == nil && s.Page.Token != "" && s.Page.Counter >= 5 && s.Page.Storage != "" && s.Cookies["amber"] != "" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never got ready in %s: %+v %v\nchromium log:\n%s", id, s, err, procLog(d, id, browser))
		}
		time.Sleep(time.Second)
	}
}

// checkBrowser checks the browser in sandbox id against before, part by
// part: the page is the same page (target id, the in-memory token) and its
// script kept counting from where it was (not reset, and still running);
// localStorage and the cookie (in the jar and as document.cookie) hold the
// values of before; the server and Chromium are the processes of before.
func checkBrowser(d Driver, id string, before browserRun) []part {
	s1, err := readBrowser(d, id)
	if err != nil {
		return []part{{"devtools", err}}
	}
	time.Sleep(time.Second)
	s2, err2 := readBrowser(d, id)
	var parts []part
	p := func(name string, err error) { parts = append(parts, part{name, err}) }
	b := before.state
	switch {
	case s1.Target != b.Target:
		p("page", fmt.Errorf("target %s, before the cut %s", s1.Target, b.Target))
	case s1.Page.Token != b.Page.Token:
		p("page", fmt.Errorf("JS token %q, before the cut %q: the page was loaded again", s1.Page.Token, b.Page.Token))
	default:
		p("page", nil)
	}
	switch {
	case s1.Page.Token != b.Page.Token || s1.Page.Counter < b.Page.Counter:
		p("js-counter", fmt.Errorf("counter %d (token %q), before the cut %d (token %q): reset", s1.Page.Counter, s1.Page.Token, b.Page.Counter, b.Page.Token))
	case err2 != nil:
		p("js-counter", fmt.Errorf("second reading: %v", err2))
	case s2.Page.Counter <= s1.Page.Counter:
		p("js-counter", fmt.Errorf("counter %d then %d a second later: not running", s1.Page.Counter, s2.Page.Counter))
	default:
		p("js-counter", nil)
	}
	if s1.Page.Storage != b.Page.Storage {
		p("localStorage", fmt.Errorf("%q, before the cut %q", s1.Page.Storage, b.Page.Storage))
	} else {
		p("localStorage", nil)
	}
	switch {
	case s1.Cookies["amber"] != b.Cookies["amber"]:
		p("cookie", fmt.Errorf("jar has amber=%q, before the cut %q", s1.Cookies["amber"], b.Cookies["amber"]))
	case s1.Page.Cookie != b.Page.Cookie:
		p("cookie", fmt.Errorf("document.cookie %q, before the cut %q", s1.Page.Cookie, b.Page.Cookie))
	default:
		p("cookie", nil)
	}
	now, err := ticks(d, id, before.server, before.browser)
	switch {
	case err != nil:
		p("processes", err)
	case fmt.Sprint(now) != fmt.Sprint(before.ticks):
		p("processes", fmt.Errorf("server and chromium (pid → start ticks) %v, before the cut %v", now, before.ticks))
	default:
		p("processes", nil)
	}
	return parts
}

// BrowserOptions tune Browser.
type BrowserOptions struct {
	// ProfileFallback allows the one fallback for a driver that cannot
	// checkpoint a running Chromium: when the live checkpoint fails, the
	// browser is closed through DevTools (it writes its profile out), the
	// sandbox is checkpointed, killed and restored without it, Chromium is
	// started again on the restored profile and the pages that were open
	// are opened again through DevTools. The cookie and localStorage must
	// then survive; the page's in-memory state cannot, and is reported as
	// lost. Without it a failed checkpoint fails the test.
	ProfileFallback bool
	// ChromiumEnv is added to Chromium's environment. TZ=UTC keeps
	// Chromium from watching /usr/share/zoneinfo with inotify (it watches
	// the time zone files only when TZ is unset), a watch the criu driver
	// cannot dump.
	ChromiumEnv []string
}

// Browser is fidelity item 5: a live headless Chromium session (page with
// running JavaScript, localStorage, cookie) survives checkpoint, kill and
// restore, and the same check fails on a fresh sandbox.
func Browser(t *testing.T, d Driver, tmpl sandbox.Template, opts BrowserOptions) {
	lap := lapper(t)
	spec := create(t, d, "browser", tmpl)
	before := startBrowser(t, d, spec.ID, opts)
	b := before.state
	lap(fmt.Sprintf("page ready: target %s token %s counter %d localStorage %s cookie %s", b.Target, b.Page.Token, b.Page.Counter, b.Page.Storage, b.Cookies["amber"]))
	// The counter as late as possible before the cut.
	if s, err := readBrowser(d, spec.ID); err == nil && s.Page.Token == b.Page.Token {
		before.state.Page.Counter = s.Page.Counter
	}
	if _, err := cut(t, d, spec, lap); err != nil {
		if !opts.ProfileFallback {
			t.Fatalf("live browser: %v", err)
		}
		browserFallback(t, d, spec, before, opts, err, lap)
	} else {
		parts := checkBrowser(d, spec.ID, before)
		if failed := report(t, "after restore", parts); len(failed) > 0 {
			t.Errorf("after restore, lost: %s\nchromium log:\n%s", strings.Join(failed, ", "), procLog(d, spec.ID, before.browser))
		}
	}
	lap("checked")
	if err := d.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}

	// Control: the same workload in a sandbox never restored; every part
	// of the session state must differ.
	ctl := create(t, d, "browser-fresh", tmpl)
	startBrowser(t, d, ctl.ID, opts)
	cparts := checkBrowser(d, ctl.ID, before)
	report(t, "fresh sandbox", cparts)
	for _, p := range cparts {
		if p.name != "processes" && p.err == nil {
			t.Errorf("fresh sandbox: the %s check passed against the state of another sandbox: it cannot tell restored from restarted", p.name)
		}
	}
	lap("control checked")
}

// browserFallback is BrowserOptions.ProfileFallback, after the live
// checkpoint of sandbox spec.ID failed with liveErr.
func browserFallback(t *testing.T, d Driver, spec sandbox.Spec, before browserRun, opts BrowserOptions, liveErr error, lap func(string)) {
	t.Helper()
	msg := liveErr.Error()
	if len(msg) > 400 {
		msg = msg[:400] + "..."
	}
	t.Logf("FALLBACK: the running browser could not be checkpointed: %s", msg)
	// The failed checkpoint resumed the sandbox: the page is still live.
	if s, err := readBrowser(d, spec.ID); err != nil || s.Page.Token != before.state.Page.Token {
		t.Fatalf("after the failed checkpoint the page is not the page of before: %+v %v", s, err)
	}
	out, err := devtools(d, spec.ID, "close", "-")
	var urls []string
	if err != nil || json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &urls) != nil || len(urls) == 0 {
		t.Fatalf("close the browser: %q %v", out, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		m, err := ticks(d, spec.ID, before.browser)
		if err == nil && len(m) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromium %d still runs 30s after Browser.close: %v %v", before.browser, m, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	lap(fmt.Sprintf("browser closed (pages %v)", urls))
	if _, err := cut(t, d, spec, lap); err != nil {
		t.Fatalf("fallback (no browser running): %v", err)
	}
	browser := startEnv(t, d, spec.ID, opts.ChromiumEnv, chromiumArgs("about:blank")...)
	for _, u := range urls {
		// DevTools listens only once Chromium is up.
		for deadline := time.Now().Add(90 * time.Second); ; {
			_, err := devtools(d, spec.ID, "open", u)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("reopen %s: %v\nchromium log:\n%s", u, err, procLog(d, spec.ID, browser))
			}
			time.Sleep(time.Second)
		}
	}
	waitPage(t, d, spec.ID, browser)
	lap(fmt.Sprintf("chromium restarted on the restored profile, %d page(s) reopened", len(urls)))
	parts := checkBrowser(d, spec.ID, before)
	report(t, "after fallback restore", parts)
	for _, p := range parts {
		switch p.name {
		case "localStorage", "cookie":
			if p.err != nil {
				t.Errorf("fallback: the profile's %s did not survive: %v", p.name, p.err)
			}
		case "page", "js-counter":
			if p.err == nil {
				t.Errorf("fallback: %s passed on a reopened page: the check cannot tell", p.name)
			}
		}
	}
	t.Logf("FALLBACK result: cookie and localStorage restored from the profile; the open page and its JavaScript state (token, counter) were NOT restored (the page was reopened)")
}
