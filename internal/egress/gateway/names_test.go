package gateway_test

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// The journal records DNS names of a host name's shape only: a name over
// 253 bytes or with a label over 63 is refused before anything is
// appended (a sandbox cannot fill the log with megabyte names), and a
// request whose Host is such a name is refused (400) before its intent
// (which carries the name in its URL) is journaled.
func TestJournalDNSNameBound(t *testing.T) {
	ctx := context.Background()
	store := openStore(t, storePath(t))
	defer store.Close()
	j := gateway.NewJournal(store)
	ep := acquire(t, store, "sb-names", "node-a")
	w := gateway.Writer{Tenant: "acme", Sandbox: "sb-names", Epoch: ep}
	stand := netip.MustParseAddr("100.96.0.7")
	long := strings.Repeat("a.", 130) + "test" // 264 bytes
	label := strings.Repeat("b", 64) + ".test"
	for _, name := range []string{long, label, strings.Repeat("c", 100000), "a..test", "", "x y.test"} {
		if _, err := j.RecordName(ctx, w, name, stand); !errdefs.IsInvalidArgument(err) {
			t.Errorf("RecordName(%.40q…, %d bytes): %v, want an invalid-argument refusal", name, len(name), err)
		}
	}
	if evs := readStream(t, store, gateway.Stream("sb-names")); len(evs) != 0 {
		t.Fatalf("%d events journaled for refused names (first %d bytes)", len(evs), len(evs[0].Payload))
	}
	ok := strings.Repeat("d", 63) + ".test"
	if got, err := j.RecordName(ctx, w, ok, stand); err != nil || got != stand {
		t.Fatalf("RecordName(a 63-byte label) = %v, %v", got, err)
	}

	// A request naming such a host is refused before its intent.
	led := newLedger(t, false)
	gw := gateway.New(gateway.Options{Logger: quietLog, Journal: j})
	defer gw.Close()
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-names", ID: "c0", Epoch: ep,
		Policy: gateway.Policy{Allow: []string{"*:*"}}}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, led.addr(), "sb-names")
	before := len(readStream(t, store, gateway.Stream("sb-names")))
	for _, host := range []string{long, label} {
		if got := rawGet(t, f, "/", host); got != http.StatusBadRequest {
			t.Errorf("Host of %d bytes: status %d, want 400", len(host), got)
		}
	}
	if after := len(readStream(t, store, gateway.Stream("sb-names"))); after != before {
		t.Fatalf("%d events journaled for requests to refused names", after-before)
	}
}
