package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/lib/failpoint"
)

func TestNormalizeURL(t *testing.T) {
	for in, want := range map[string]string{
		"HTTP://API.Example.COM:80/a/./b/../c?z=1&a=2&a=1#frag": "http://api.example.com/a/c?a=2&a=1&z=1",
		"http://h:8080":          "http://h:8080/",
		"https://h:443/x/":       "https://h/x/",
		"http://[::1]:9/p?q":     "http://[::1]:9/p?q=",
		"http://h/%7Euser/a%2Fb": "http://h/~user/a%2Fb",
		"http://h/p?b=%20&a=x+y": "http://h/p?a=x+y&b=+",
	} {
		got, err := gateway.NormalizeURL(in)
		if err != nil || got != want {
			t.Errorf("NormalizeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// env is a journaled gateway in front of a ledger.
type env struct {
	led   *ledger
	store interface{ Close() error }
	gw    *gateway.Gateway
	f     *front
	ds    *decisions
	j     *gateway.Journal
}

func newEnv(t *testing.T, p func(*gateway.Policy), fp *failpoint.Set) *env {
	led := newLedger(t, false)
	store := openStore(t, storePath(t))
	t.Cleanup(func() { store.Close() })
	ds := &decisions{}
	j := gateway.NewJournal(store)
	gw := gateway.New(gateway.Options{Journal: j, Logger: quietLog, OnDecision: ds.add, Failpoints: fp})
	t.Cleanup(func() { gw.Close() })
	policy := allowLoopback(led.addr())
	if p != nil {
		p(&policy)
	}
	epoch := acquire(t, store, "sb", "n")
	if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb", ID: "c0", Epoch: epoch, Policy: policy}); err != nil {
		t.Fatal(err)
	}
	return &env{led: led, store: store, gw: gw, f: newFront(t, gw, led.addr(), "sb"), ds: ds, j: j}
}

// restart begins the run again from the same cut (a restore).
func (e *env) restart(t *testing.T, p func(*gateway.Policy)) {
	policy := allowLoopback(e.led.addr())
	if p != nil {
		p(&policy)
	}
	if err := e.gw.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb", ID: "c0", Epoch: 1, Policy: policy}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) post(t *testing.T, path, body string) *http.Response {
	t.Helper()
	resp, err := e.f.client().Post("http://"+e.led.addr().String()+path, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestReplayAnswersFromJournal: a restored run's GETs and POSTs are answered
// from the journal, byte for byte, without reaching the upstream.
func TestReplayAnswersFromJournal(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.f.client()
	url := "http://" + e.led.addr().String()
	read := func() []string {
		var out []string
		for _, r := range []func() (*http.Response, error){
			func() (*http.Response, error) { return c.Get(url + "/balance?b=2&a=1") },
			func() (*http.Response, error) {
				return c.Post(url+"/charge", "application/json", bytes.NewBufferString(`{"step":1}`))
			},
			func() (*http.Response, error) {
				return c.Post(url+"/charge", "application/json", bytes.NewBufferString(`{"step":1}`))
			},
		} {
			resp, err := r()
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out = append(out, fmt.Sprintf("%d %s %s", resp.StatusCode, b, resp.Header.Get(gateway.HeaderReplayed)))
		}
		return out
	}
	first := read()
	_, _, n1 := e.led.snapshot()
	e.restart(t, nil)
	second := read()
	_, _, n2 := e.led.snapshot()
	if n1 != 3 || n2 != 3 {
		t.Fatalf("upstream requests %d then %d, want 3 then 3", n1, n2)
	}
	for i := range first {
		if first[i]+"true" != second[i] {
			t.Errorf("request %d: first %q, replay %q", i, first[i], second[i])
		}
	}
	// The two identical charges are two effects (occurrences 1 and 2).
	if ch, _, _ := e.led.snapshot(); ch[1] != 2 {
		t.Errorf("identical charges booked %d times, want 2", ch[1])
	}
}

// TestConcurrentReorder: identical requests sent concurrently, re-run in
// another order, all match the journal.
func TestConcurrentReorder(t *testing.T) {
	e := newEnv(t, nil, nil)
	burst := func() {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.post(t, "/charge", fmt.Sprintf(`{"step":%d}`, i%2+1))
			}()
		}
		wg.Wait()
	}
	burst()
	_, _, n1 := e.led.snapshot()
	e.restart(t, nil)
	burst()
	_, _, n2 := e.led.snapshot()
	if n1 != 8 || n2 != 8 {
		t.Fatalf("upstream requests %d then %d, want 8 then 8", n1, n2)
	}
}

// TestDivergence: a re-run request at a recorded position with another body
// is journaled as a divergence and refused (default) or forwarded.
func TestDivergence(t *testing.T) {
	for _, pol := range []gateway.DivergencePolicy{gateway.DivergenceFail, gateway.DivergenceForward} {
		t.Run(string(pol), func(t *testing.T) {
			setPol := func(p *gateway.Policy) { p.OnDivergence = pol }
			e := newEnv(t, setPol, nil)
			e.post(t, "/charge", `{"step":1,"amount":100}`)
			e.restart(t, setPol)
			resp := e.post(t, "/charge", `{"step":1,"amount":999}`)
			charges, _, _ := e.led.snapshot()
			switch pol {
			case gateway.DivergenceFail:
				if resp.StatusCode != http.StatusConflict || resp.Header.Get(gateway.HeaderError) != "divergence" || charges[1] != 1 {
					t.Fatalf("status %d, charges %d; want 409 and 1 charge", resp.StatusCode, charges[1])
				}
			case gateway.DivergenceForward:
				if resp.StatusCode != http.StatusOK || charges[1] != 2 {
					t.Fatalf("status %d, charges %d; want 200 and 2 charges", resp.StatusCode, charges[1])
				}
			}
			if e.ds.kinds()["divergence"] != 1 {
				t.Fatalf("decisions %v, want one divergence", e.ds.kinds())
			}
			n := 0
			for _, ev := range readStream(t, e.store.(eventStore), gateway.Stream("sb")) {
				if ev.Type == gateway.EventDivergence {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d divergence events in the journal, want 1", n)
			}
		})
	}
}

// TestFencedForwardsNothing: once another node took the effects stream's
// lease, this gateway's intents are refused and nothing goes upstream.
func TestFencedForwardsNothing(t *testing.T) {
	e := newEnv(t, nil, nil)
	if resp := e.post(t, "/charge", `{"step":1}`); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	st := e.store.(eventStore)
	l, _ := st.CurrentLease(context.Background(), gateway.Stream("sb"))
	if err := st.Release(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	acquire(t, st, "sb", "node-b")
	resp := e.post(t, "/charge", `{"step":2}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(gateway.HeaderError) != "fenced" {
		t.Fatalf("fenced gateway answered %d %q", resp.StatusCode, resp.Header.Get(gateway.HeaderError))
	}
	if _, req, _ := e.led.snapshot(); req[2] != 0 {
		t.Fatalf("fenced gateway forwarded %d requests", req[2])
	}

	// The new owner's gateway reads the journal from the shared log: the
	// re-run's step 1 is replayed, step 2 goes out once.
	l2, _ := st.CurrentLease(context.Background(), gateway.Stream("sb"))
	gw2 := gateway.New(gateway.Options{Journal: gateway.NewJournal(st), Logger: quietLog})
	defer gw2.Close()
	if err := gw2.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb", ID: "c0", Epoch: l2.Epoch, Policy: allowLoopback(e.led.addr())}); err != nil {
		t.Fatal(err)
	}
	e.f.setGateway(gw2)
	for step := 1; step <= 2; step++ {
		if resp := e.post(t, "/charge", fmt.Sprintf(`{"step":%d}`, step)); resp.StatusCode != 200 {
			t.Fatalf("step %d on the new owner: %s", step, resp.Status)
		}
	}
	if ch, req, _ := e.led.snapshot(); ch[1] != 1 || req[1] != 1 || ch[2] != 1 {
		t.Fatalf("after failover: charges %v requests %v; want one each, step 1 not re-sent", ch, req)
	}
}

// TestH2C: HTTP/2 with prior knowledge goes through the journal too.
func TestH2C(t *testing.T) {
	e := newEnv(t, nil, nil)
	tr := &http.Transport{
		DialTLSContext: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", e.f.ln.Addr().String())
		},
		TLSClientConfig: &tls.Config{},
	}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	for i := range 2 {
		resp, err := c.Post("http://"+e.led.addr().String()+"/charge", "application/json", bytes.NewBufferString(`{"step":7}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
			t.Fatalf("request %d: %s %d", i, resp.Proto, resp.StatusCode)
		}
	}
	if k := e.ds.kinds(); k["forward"] != 2 {
		t.Fatalf("decisions %v", k)
	}
}

// TestServeConnReturns: ServeConn returns when the client closes, for
// HTTP/1.1 and h2c, so the plumbing's goroutine per connection ends.
func TestServeConnReturns(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		led := newLedger(t, false)
		gw := gateway.New(gateway.Options{Logger: quietLog})
		if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "a", Sandbox: "s", ID: "c", Policy: allowLoopback(led.addr())}); err != nil {
			t.Fatal(err)
		}
		cli, srv := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- gw.ServeConn(context.Background(), srv, led.addr(), "s") }()
		tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return cli, nil }}
		if h2 {
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		resp, err := (&http.Client{Transport: tr}).Get("http://" + led.addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		cli.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("h2=%v: ServeConn: %v", h2, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("h2=%v: ServeConn did not return after the client closed", h2)
		}
	}
}

// TestServeConnCancel: cancelling ServeConn's context ends it while the
// client keeps an idle keep-alive connection open.
func TestServeConnCancel(t *testing.T) {
	led := newLedger(t, false)
	gw := gateway.New(gateway.Options{Logger: quietLog})
	if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "a", Sandbox: "s", ID: "c", Policy: allowLoopback(led.addr())}); err != nil {
		t.Fatal(err)
	}
	cli, srv := net.Pipe()
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.ServeConn(ctx, srv, led.addr(), "s") }()
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return cli, nil }}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + led.addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the connection stays open, idle
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not return after its context was cancelled")
	}
}

// TestLargeBodyNotJournaled: an answer over the journal's body limit is
// recorded by size; on a re-run a GET (replay-safe) is fetched again, a POST
// gets a clear error instead of a made-up answer.
func TestLargeBodyNotJournaled(t *testing.T) {
	led := newLedger(t, false)
	store := openStore(t, storePath(t))
	defer store.Close()
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(store), Logger: quietLog, MaxJournaledBody: 1024})
	defer gw.Close()
	run := gateway.Run{Tenant: "acme", Sandbox: "sb", ID: "c0", Epoch: acquire(t, store, "sb", "n"), Policy: allowLoopback(led.addr())}
	if err := gw.StartRun(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, led.addr(), "sb")
	c := f.client()
	url := "http://" + led.addr().String() + "/big"
	do := func(method string) (int, int) {
		req, _ := http.NewRequest(method, url, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, len(b)
	}
	for _, m := range []string{"GET", "POST"} {
		if st, n := do(m); st != 200 || n != 4096 {
			t.Fatalf("%s: %d, %d bytes", m, st, n)
		}
	}
	if err := gw.StartRun(context.Background(), run); err != nil { // re-run from the cut
		t.Fatal(err)
	}
	if st, n := do("GET"); st != 200 || n != 4096 {
		t.Fatalf("re-run GET: %d, %d bytes", st, n)
	}
	if st, _ := do("POST"); st != http.StatusBadGateway {
		t.Fatalf("re-run POST: %d, want 502 body-not-journaled", st)
	}
	if _, _, total := led.snapshot(); total != 3 {
		t.Fatalf("upstream requests %d, want 3 (GET twice, POST once)", total)
	}
}

// TestRestoreWhileInFlight: the sandbox is restored from the cut while the
// daemon (and a request of the previous incarnation) is still alive; the
// re-run's identical request waits for the in-flight outcome and is
// answered from it — the upstream sees one request, even at-most-once.
func TestRestoreWhileInFlight(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	hits := 0
	up := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		<-release
		io.WriteString(w, "charged")
	}))
	dst := netipAddrPort(up.Listener.Addr().String())
	store := openStore(t, storePath(t))
	defer store.Close()
	fp := failpoint.New()
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(store), Logger: quietLog, Failpoints: fp})
	defer gw.Close()
	p := allowLoopback(dst)
	p.Modes = []gateway.ModeRule{{Dest: "*:*", Mode: gateway.ModeAtMostOnce}}
	run := gateway.Run{Tenant: "a", Sandbox: "s", ID: "c0", Epoch: acquire(t, store, "s", "n"), Policy: p}
	if err := gw.StartRun(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, dst, "s")
	answers := make(chan string, 2)
	send := func() {
		resp, err := f.client().Post("http://"+dst.String()+"/charge", "text/plain", bytes.NewBufferString("x"))
		if err != nil {
			answers <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	go send()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return hits == 1 })
	if err := gw.StartRun(context.Background(), run); err != nil { // restored from the cut
		t.Fatal(err)
	}
	go send()
	waitFor(t, func() bool { return fp.Hits(gateway.FPWaitInFlight) == 1 }) // the re-run waits
	close(release)
	for range 2 {
		if a := <-answers; a != "200 charged" {
			t.Fatalf("answer %q, want 200 charged", a)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 1 {
		t.Fatalf("upstream saw %d requests, want 1", hits)
	}
}
