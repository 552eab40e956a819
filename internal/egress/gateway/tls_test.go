package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
)

// TestTLSTermination: a sandbox speaking HTTPS (HTTP/1.1 and HTTP/2 by
// ALPN) to a name trusts the tenant's CA; the gateway terminates, journals,
// substitutes secrets and re-encrypts to the upstream, verifying it. A re-run
// is answered from the journal.
func TestTLSTermination(t *testing.T) {
	ctx := context.Background()
	led := &ledger{egresstest.NewTLSLedger(t, false)}
	up := led.Server // cert valid for example.com
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())

	ca, err := gateway.NewCA("acme")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	if ca, err = gateway.LoadCA(certPEM, keyPEM); err != nil { // round trip, as after a daemon restart
		t.Fatal(err)
	}
	cas := gateway.NewTenantCAs()
	cas.Put("acme", ca)
	secrets, _ := gateway.NewMemorySecrets(bytes.Repeat([]byte{1}, 32))
	host := "example.com:" + strings.Split(upAddr.String(), ":")[1]
	secrets.Put("acme", "stripe", []byte("sk_tls_secret"), host)

	store := openStore(t, storePath(t))
	defer store.Close()
	var ds decisions
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(store), Logger: quietLog, OnDecision: ds.add,
		TLS: cas, UpstreamRoots: roots, Secrets: secrets, Resolver: fakeResolver{"example.com": "127.0.0.1"}})
	defer gw.Close()
	policy := gateway.Policy{Allow: []string{host}, AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	run := gateway.Run{Tenant: "acme", Sandbox: "sb-tls", ID: "c0", Epoch: acquire(t, store, "sb-tls", "n"), Policy: policy}
	if err := gw.StartRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, upAddr, "sb-tls")

	client := func(h2 bool) *http.Client {
		tr := &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: ca.Pool()}, // the sandbox trusts the tenant CA only
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", f.ln.Addr().String())
			},
			ForceAttemptHTTP2: h2,
		}
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	program := func() []string {
		var out []string
		for i, h2 := range []bool{false, true} {
			req, _ := http.NewRequest("POST", "https://"+host+"/charge", strings.NewReader(`{"step":`+string(rune('1'+i))+`}`))
			req.Header.Set("Authorization", "Bearer amber-secret://stripe")
			resp, err := client(h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.ProtoMajor != map[bool]int{false: 1, true: 2}[h2] {
				t.Fatalf("h2=%v: %s %d %s", h2, resp.Proto, resp.StatusCode, b)
			}
			out = append(out, string(b))
		}
		return out
	}
	first := program()
	if led.auth() != "Bearer sk_tls_secret" {
		t.Fatalf("upstream saw %q", led.auth())
	}
	if err := gw.StartRun(ctx, run); err != nil { // restore from the cut
		t.Fatal(err)
	}
	second := program()
	charges, _, total := led.snapshot()
	if total != 2 || charges[1] != 1 || charges[2] != 1 {
		t.Fatalf("upstream saw %d requests, charges %v; want 2 and one per step", total, charges)
	}
	if strings.Join(first, "|") != strings.Join(second, "|") {
		t.Fatalf("replayed answers differ: %q vs %q", first, second)
	}
	var urls []string
	for _, ev := range readStream(t, store, gateway.Stream("sb-tls")) {
		if ev.Type == gateway.EventIntent {
			urls = append(urls, string(ev.Payload))
		}
		if bytes.Contains(ev.Payload, []byte("sk_tls_secret")) {
			t.Fatalf("secret in the journal: %s", ev.Payload)
		}
	}
	if len(urls) != 2 || !strings.Contains(urls[0], `"url":"https://example.com:`) {
		t.Fatalf("intents %q", urls)
	}
	if k := ds.kinds(); k["forward"] != 2 || k["replay"] != 2 {
		t.Fatalf("decisions %v", k)
	}

	// An upstream whose certificate does not verify is an error, not a
	// silent downgrade.
	bad := gateway.New(gateway.Options{Logger: quietLog, TLS: cas, Resolver: fakeResolver{"example.com": "127.0.0.1"}})
	defer bad.Close()
	if err := bad.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-tls2", ID: "c0", Policy: policy}); err != nil {
		t.Fatal(err)
	}
	f2 := newFront(t, bad, upAddr, "sb-tls2")
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", f2.ln.Addr().String())
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + host + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("unverifiable upstream: %d, want 502", resp.StatusCode)
	}
}
