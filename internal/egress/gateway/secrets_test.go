package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/internal/egress/gateway"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecretsNeverLeak sends placeholders through the gateway to a bound
// host (which must receive the real value), to an upstream that echoes the
// credential back, and to an unbound host; then greps the journal stream,
// the logs, the decisions and everything the client received for the value.
func TestSecretsNeverLeak(t *testing.T) {
	ctx := context.Background()
	const secret = "sk_live_51HUSH-do-not-leak-4242"
	led := newLedger(t, true)
	other := newLedger(t, true) // not bound to the secret
	store := openStore(t, storePath(t))
	defer store.Close()

	secrets, err := gateway.NewMemorySecrets(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	if err := secrets.Put("acme", "stripe", []byte(secret), led.addr().String()); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	var ds decisions
	gw := gateway.New(gateway.Options{
		Journal:    gateway.NewJournal(store),
		Secrets:    secrets,
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDecision: ds.add,
	})
	defer gw.Close()
	policy := allowLoopback(led.addr())
	policy.Allow = append(policy.Allow, other.addr().String())
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-sec", ID: "c0", Epoch: acquire(t, store, "sb-sec", "n"), Policy: policy}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, led.addr(), "sb-sec")
	c := f.client()
	var seen strings.Builder // everything the sandbox received

	do := func(path, auth string) int {
		req, _ := http.NewRequest("POST", "http://"+f.origDst.String()+path, strings.NewReader(`{"step":1}`))
		req.Header.Set("Authorization", auth)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			// A length the gateway's redaction made untrue shows here.
			t.Fatalf("read the answer of %s: %v", path, err)
		}
		fmt.Fprintf(&seen, "%v %s\n", resp.Header, b)
		return resp.StatusCode
	}

	// Bound host: the upstream receives the real value.
	if st := do("/charge", "Bearer amber-secret://stripe"); st != 200 {
		t.Fatalf("charge: %d", st)
	}
	if got := led.auth(); got != "Bearer "+secret {
		t.Fatalf("upstream saw Authorization %q, want the substituted secret", got)
	}
	// Basic credentials carry the placeholder base64-encoded.
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("acct:amber-secret://stripe"))
	if st := do("/echo-auth", basic); st != 200 {
		t.Fatalf("basic: %d", st)
	}
	if got, want := led.auth(), "Basic "+base64.StdEncoding.EncodeToString([]byte("acct:"+secret)); got != want {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
	// An upstream echoing the credential: the sandbox gets the placeholder.
	if st := do("/echo-auth", "Bearer amber-secret://stripe"); st != 200 {
		t.Fatalf("echo: %d", st)
	}
	if !strings.Contains(seen.String(), "you sent Bearer amber-secret://stripe") {
		t.Fatalf("echoed credential not redacted to its placeholder: %s", seen.String())
	}
	// Unbound host: refused; the upstream never sees the request.
	f.setDst(other.addr())
	if st := do("/charge", "Bearer amber-secret://stripe"); st != http.StatusForbidden {
		t.Fatalf("unbound host: %d, want 403", st)
	}
	if _, _, n := other.snapshot(); n != 0 {
		t.Fatalf("unbound host received %d requests", n)
	}
	// Unknown secret: refused, named, not leaked.
	f.setDst(led.addr())
	if st := do("/charge", "Bearer amber-secret://nope"); st != http.StatusForbidden {
		t.Fatalf("unknown secret: %d, want 403", st)
	}

	var journal strings.Builder
	for _, ev := range readStream(t, store, gateway.Stream("sb-sec")) {
		journal.Write(ev.Payload)
	}
	if !strings.Contains(journal.String(), "amber-secret://stripe") {
		t.Fatalf("journal does not hold the placeholder form of the headers")
	}
	encoded := base64.StdEncoding.EncodeToString([]byte(secret))
	var decs strings.Builder
	for _, d := range ds.ds {
		fmt.Fprintf(&decs, "%+v\n", d)
	}
	for what, text := range map[string]string{"journal": journal.String(), "logs": logs.String(),
		"decisions": decs.String(), "sandbox": seen.String()} {
		for _, needle := range []string{secret, encoded, secret[8:20]} {
			if strings.Contains(text, needle) {
				t.Errorf("the secret (%q) leaked into the %s", needle, what)
			}
		}
	}
	if logs.String() == "" {
		t.Fatal("no logs captured: the grep proves nothing")
	}
}
