package egress

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// NameRecorder persists the stand-in address of a name before the sandbox
// is told (the gateway's effect journal): it returns the address recorded
// for the name, an earlier one if there was one. Names lists what was
// recorded.
type NameRecorder interface {
	RecordName(ctx context.Context, sandbox, name string, addr netip.Addr) (netip.Addr, error)
	Names(ctx context.Context, sandbox string) (map[string]netip.Addr, error)
}

// names is one sandbox's table of stand-in addresses.
type names struct {
	sandbox string
	rec     NameRecorder

	mu     sync.Mutex
	loaded bool
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
}

func newNames(sandbox string, rec NameRecorder) *names {
	return &names{sandbox: sandbox, rec: rec, byName: map[string]netip.Addr{}, byAddr: map[netip.Addr]string{}}
}

// load reads the recorded names once (lazily: the sandbox's journal may
// not be readable until its run started).
func (t *names) load(ctx context.Context) error {
	if t.loaded {
		return nil
	}
	m, err := t.rec.Names(ctx, t.sandbox)
	if err != nil {
		return err
	}
	for n, a := range m {
		t.byName[n], t.byAddr[a] = a, n
	}
	t.loaded = true
	return nil
}

// standIn is the i-th candidate address for name: a hash of the name into
// StandIns, skipping its first and last address, then probing linearly.
func standIn(name string, i int) netip.Addr {
	h := fnv.New64a()
	h.Write([]byte(name))
	size := uint64(1) << (32 - StandIns.Bits())
	off := (h.Sum64()+uint64(i))%(size-2) + 1
	b := StandIns.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// addr returns name's stand-in, allocating and recording one if needed.
func (t *names) addr(ctx context.Context, name string) (netip.Addr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.load(ctx); err != nil {
		return netip.Addr{}, err
	}
	if a, ok := t.byName[name]; ok {
		return a, nil
	}
	for i := 0; i < 64; i++ {
		a := standIn(name, i)
		if _, taken := t.byAddr[a]; taken {
			continue
		}
		got, err := t.rec.RecordName(ctx, t.sandbox, name, a)
		if err != nil {
			return netip.Addr{}, err
		}
		t.byName[name], t.byAddr[got] = got, name
		return got, nil
	}
	return netip.Addr{}, errors.New("no free stand-in address")
}

// name returns the name whose stand-in is a, if any.
func (t *names) name(ctx context.Context, a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.load(ctx); err != nil {
		return "", false
	}
	n, ok := t.byAddr[a]
	return n, ok
}

// maxName bounds a query name (RFC 1035: 255 octets on the wire, 253 in
// text form) and maxLabel one of its labels. Longer names, and names with
// bytes no host name has, are refused before they are journaled.
const (
	maxName  = 253
	maxLabel = 63
)

// validName says whether name (lower-cased, without the root's dot) may be
// given a stand-in address: 1 to 253 bytes, labels of 1 to 63 letters,
// digits, '-' or '_'.
func validName(name string) bool {
	if name == "" || len(name) > maxName {
		return false
	}
	label := 0
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		if label++; label > maxLabel {
			return false
		}
	}
	return label > 0
}

// serveDNS answers the sandbox's queries on uc until it is closed.
func serveDNS(ctx context.Context, uc *net.UDPConn, t *names, log *slog.Logger) {
	buf := make([]byte, 1500)
	for {
		n, from, err := uc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Warn("egress dns: read", "sandbox", t.sandbox, "err", err)
			}
			return
		}
		resp := answer(ctx, buf[:n], t, log)
		if resp != nil {
			uc.WriteToUDPAddrPort(resp, from)
		}
	}
}

// answer builds the response to one query, or nil for garbage.
func answer(ctx context.Context, query []byte, t *names, log *slog.Logger) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	var answerA *dnsmessage.AResource
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	switch {
	case h.OpCode != 0:
		rh.RCode = dnsmessage.RCodeNotImplemented
	case q.Class != dnsmessage.ClassINET || !validName(name):
		rh.RCode = dnsmessage.RCodeRefused
	case q.Type == dnsmessage.TypeA:
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		a, err := t.addr(qctx, name)
		cancel()
		if err != nil {
			log.Warn("egress dns: cannot record a stand-in; SERVFAIL", "sandbox", t.sandbox, "name", name, "err", err)
			rh.RCode = dnsmessage.RCodeServerFailure
		} else {
			answerA = &dnsmessage.AResource{A: a.As4()}
		}
	default:
		// AAAA and everything else: the name exists, with no such record;
		// the sandbox falls back to A.
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil
	}
	if err := b.Question(q); err != nil {
		return nil
	}
	if answerA != nil {
		if err := b.StartAnswers(); err != nil {
			return nil
		}
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 300}
		if err := b.AResource(hdr, *answerA); err != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
