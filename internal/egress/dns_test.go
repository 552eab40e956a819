package egress

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// memRecorder is a NameRecorder in memory that keeps every name it was
// asked to record.
type memRecorder struct {
	mu  sync.Mutex
	m   map[string]netip.Addr
	all []string
}

func (r *memRecorder) RecordName(_ context.Context, _, name string, a netip.Addr) (netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, name)
	if r.m == nil {
		r.m = map[string]netip.Addr{}
	}
	if got, ok := r.m[name]; ok {
		return got, nil
	}
	r.m[name] = a
	return a, nil
}

func (r *memRecorder) Names(context.Context, string) (map[string]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]netip.Addr{}
	for k, v := range r.m {
		out[k] = v
	}
	return out, nil
}

func query(t testing.TB, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	n, err := dnsmessage.NewName(name)
	if err != nil {
		t.Fatal(err)
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: n, Type: typ, Class: dnsmessage.ClassINET})
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func rcode(t testing.TB, resp []byte) dnsmessage.RCode {
	t.Helper()
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		t.Fatalf("response does not parse: %v", err)
	}
	return h.RCode
}

// The sandbox's DNS refuses names no host has — a label over 63 bytes,
// bytes outside a host name's alphabet — before they reach the journal.
func TestDNSRefusesUnboundedNames(t *testing.T) {
	rec := &memRecorder{}
	tab := newNames("sb", rec)
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	// A 64-byte label cannot be on the wire (0x40 is no length byte): the
	// parser drops it, nothing answered or recorded.
	long := append([]byte{0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 64}, strings.Repeat("b", 64)...)
	long = append(long, 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	if resp := answer(ctx, long, tab, log); resp != nil {
		t.Errorf("a 64-byte label answered")
	}
	for _, name := range []string{
		"a\x00b.test.",
		"a%25x.test.",
		"x y.test.",
	} {
		resp := answer(ctx, query(t, name, dnsmessage.TypeA), tab, log)
		if resp == nil || rcode(t, resp) != dnsmessage.RCodeRefused {
			t.Errorf("query %q: not refused", name)
		}
	}
	if len(rec.all) != 0 {
		t.Fatalf("names recorded: %q", rec.all)
	}
	resp := answer(ctx, query(t, strings.Repeat("c", 63)+".test.", dnsmessage.TypeA), tab, log)
	if resp == nil || rcode(t, resp) != dnsmessage.RCodeSuccess || len(rec.all) != 1 {
		t.Fatalf("a 63-byte label: not answered (recorded %q)", rec.all)
	}
}

// FuzzDNSAnswer feeds the responder arbitrary packets: it never panics, an
// answer parses and echoes the query's id, every name it records is a host
// name's shape, and every address it gives is a stand-in.
func FuzzDNSAnswer(f *testing.F) {
	f.Add(query(f, "api.example.com.", dnsmessage.TypeA))
	f.Add(query(f, "api.example.com.", dnsmessage.TypeAAAA))
	f.Add(query(f, strings.Repeat("b", 63)+".test.", dnsmessage.TypeA))
	f.Add([]byte{0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}) // a pointer to itself
	f.Add([]byte{0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'a', '%', 'b', 0, 0, 1, 0, 1})
	f.Add([]byte{})
	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		rec := &memRecorder{}
		tab := newNames("sb", rec)
		resp := answer(context.Background(), pkt, tab, log)
		for _, n := range rec.all {
			if !validName(n) || len(n) > maxName {
				t.Fatalf("recorded name %q (%d bytes)", n, len(n))
			}
			for _, l := range strings.Split(n, ".") {
				if len(l) == 0 || len(l) > maxLabel {
					t.Fatalf("recorded name %q: label %q", n, l)
				}
			}
		}
		if resp == nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(resp)
		if err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		var qp dnsmessage.Parser
		qh, _ := qp.Start(pkt)
		if h.ID != qh.ID || !h.Response {
			t.Fatalf("answer id %d response %v, query id %d", h.ID, h.Response, qh.ID)
		}
		p.SkipAllQuestions()
		for {
			rh, err := p.AnswerHeader()
			if err != nil {
				break
			}
			if rh.Type != dnsmessage.TypeA {
				t.Fatalf("answer of type %v", rh.Type)
			}
			a, err := p.AResource()
			if err != nil {
				t.Fatal(err)
			}
			if ip := netip.AddrFrom4(a.A); !StandIns.Contains(ip) {
				t.Fatalf("answered %s, not a stand-in", ip)
			}
		}
	})
}
