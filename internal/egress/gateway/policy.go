package gateway

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mode says what the gateway does with a request whose intent is recorded
// but whose outcome is not (the gateway crashed between sending and
// recording).
type Mode string

const (
	// ModeIdempotentKey (default for POST, PUT, PATCH, DELETE): every
	// attempt carries the same Idempotency-Key header, derived from the
	// journal key, so a re-send is deduplicated by the upstream. It replaces
	// one the client sent (a client's key may be random and differ on the
	// re-run); the journal keeps the client's headers as sent.
	ModeIdempotentKey Mode = "idempotent-key"
	// ModeAtMostOnce: never re-sent. The client gets a clear error and the
	// effect is marked as needing reconciliation.
	ModeAtMostOnce Mode = "at-most-once"
	// ModeReplaySafe (default for GET, HEAD, OPTIONS, TRACE): re-sent.
	ModeReplaySafe Mode = "replay-safe"
)

// DivergencePolicy says what to do with a re-run request that differs from
// the one recorded at the same position (same method and URL, n-th since
// the cut, another body). Either way a divergence event is journaled.
type DivergencePolicy string

const (
	// DivergenceFail (default) answers 409 and forwards nothing.
	DivergenceFail DivergencePolicy = "fail"
	// DivergenceForward forwards the request as a new effect.
	DivergenceForward DivergencePolicy = "forward"
)

// ModeRule assigns a mode to requests matching Dest (a destination pattern,
// see Policy.Allow) and Method ("" for any).
type ModeRule struct {
	Dest   string
	Method string
	Mode   Mode
}

// Policy is a sandbox's egress policy. The zero value denies everything.
type Policy struct {
	// Allow lists the destinations a sandbox may reach, as "host:port"
	// patterns: host is a name, "*.suffix" (any subdomain), an IP literal or
	// "*"; port is a number or "*". HTTP requests are matched by the name in
	// their Host header, other TCP by the original destination's address.
	Allow []string
	// AllowNets exempts these networks from DeniedNets. Without it, a
	// destination that resolves into a denied range is refused even when
	// Allow matches its name.
	AllowNets []netip.Prefix
	// DeniedNets are refused by default; nil means DefaultDeniedNets.
	DeniedNets []netip.Prefix
	// RequestsPerSecond and Burst bound the request rate of the sandbox
	// (HTTP requests and new TCP streams). 0 means unlimited.
	RequestsPerSecond float64
	Burst             int
	// BytesPerSecond bounds the sandbox's egress bandwidth, both directions
	// together, over streams and HTTP bodies (bursts up to one second's
	// worth); 0 means unlimited.
	BytesPerSecond int64
	// Modes are tried in order; the first match wins, then the method's
	// default.
	Modes []ModeRule
	// OnDivergence defaults to DivergenceFail.
	OnDivergence DivergencePolicy
}

// DefaultDeniedNets are the private, loopback, link-local, CGNAT,
// documentation, multicast and unspecified ranges, IPv4 and IPv6. IPv6
// addresses that embed an IPv4 address are also checked by that address
// (see embeddedIPv4), and the host's own addresses are always denied (see
// hostAddrs).
var DefaultDeniedNets = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
	"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	"64:ff9b:1::/48", // local-use NAT64 (RFC 8215): a translator of the site's own
	"100::/64",       // discard-only
	"2001:db8::/32",  // documentation
	// Teredo (RFC 4380) embeds a server's IPv4 address and, obfuscated, the
	// client's; a relay the operator does not run forwards it. No sandbox
	// needs it and decoding it proves nothing about where the relay goes,
	// so the whole prefix is denied.
	"2001::/32",
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// allowed reports whether host:port matches Allow.
func (p *Policy) allowed(host string, port uint16) bool {
	for _, pat := range p.Allow {
		if matchDest(pat, host, port) {
			return true
		}
	}
	return false
}

// addrDenied reports whether ip is refused (see denyReason).
func (p *Policy) addrDenied(ip netip.Addr) bool { return p.denyReason(ip) != "" }

// denyReason says why ip may not be dialled, "" if it may. The decision is
// made on the address the gateway dials, never on a name:
//
//   - an address with a zone (fe80::1%eth0, ::1%x) is refused outright: a
//     zone names an interface of the host, which means nothing for a
//     destination a sandbox asks for (and netip.Prefix.Contains never
//     matches a zoned address, so it would pass every range check);
//   - an IPv4-mapped address (::ffff:a.b.c.d) is its IPv4 address;
//   - an IPv6 address that embeds an IPv4 address — NAT64 64:ff9b::/96,
//     6to4 2002::/16, IPv4-compatible ::a.b.c.d — is refused if either
//     address is (NAT64 to a public IPv4 address works);
//   - the host's own addresses (every interface's, see hostAddrs) are
//     refused: a service bound to one of them is the host's, not the
//     internet's.
//
// AllowNets exempts an address (and an embedded one) from all of it but
// the zone rule.
func (p *Policy) denyReason(ip netip.Addr) string {
	if !ip.IsValid() {
		return "not an address"
	}
	if ip.Zone() != "" {
		return "an address with an IPv6 zone"
	}
	ip = ip.Unmap()
	if p.netDenied(ip) {
		return "a denied network"
	}
	if v4, ok := embeddedIPv4(ip); ok && p.netDenied(v4) {
		return "an IPv6 address embedding " + v4.String() + ", in a denied network"
	}
	if !p.exempt(ip) && isHostAddr(ip) {
		return "an address of the gateway's host"
	}
	if v4, ok := embeddedIPv4(ip); ok && !p.exempt(v4) && isHostAddr(v4) {
		return "an IPv6 address embedding " + v4.String() + ", an address of the gateway's host"
	}
	return ""
}

func (p *Policy) exempt(ip netip.Addr) bool {
	for _, n := range p.AllowNets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// netDenied reports whether ip (unzoned, unmapped) is in DeniedNets and
// not exempted by AllowNets.
func (p *Policy) netDenied(ip netip.Addr) bool {
	if p.exempt(ip) {
		return false
	}
	denied := p.DeniedNets
	if denied == nil {
		denied = DefaultDeniedNets
	}
	for _, n := range denied {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

var (
	nat64Prefix  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
	v4Compatible = netip.MustParsePrefix("::/96")
)

// embeddedIPv4 returns the IPv4 address an IPv6 address carries: the low
// 32 bits of a NAT64 (RFC 6052 well-known prefix) or IPv4-compatible
// address, bits 16-47 of a 6to4 address. Teredo is denied whole (see
// DefaultDeniedNets), local-use NAT64 too.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.WithZone("").As16()
	switch {
	case nat64Prefix.Contains(ip.WithZone("")), v4Compatible.Contains(ip.WithZone("")):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(ip.WithZone("")):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// mode returns the mode of a request.
func (p *Policy) mode(method, host string, port uint16) Mode {
	for _, r := range p.Modes {
		if (r.Method == "" || strings.EqualFold(r.Method, method)) && matchDest(r.Dest, host, port) {
			return r.Mode
		}
	}
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return ModeReplaySafe
	}
	return ModeIdempotentKey
}

func (p *Policy) divergence() DivergencePolicy {
	if p.OnDivergence == "" {
		return DivergenceFail
	}
	return p.OnDivergence
}

// matchDest matches "host:port" patterns (see Policy.Allow).
func matchDest(pat, host string, port uint16) bool {
	ph, pp, err := net.SplitHostPort(pat)
	if err != nil {
		return false
	}
	if pp != "*" {
		n, err := strconv.ParseUint(pp, 10, 16)
		if err != nil || uint16(n) != port {
			return false
		}
	}
	ph, host = strings.ToLower(ph), strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case ph == "*":
		return true
	case strings.HasPrefix(ph, "*."):
		// Any subdomain: a name, never an IP address ("*.0.1" does not
		// match 10.0.0.1).
		if _, err := netip.ParseAddr(host); err == nil {
			return false
		}
		return strings.HasSuffix(host, ph[1:])
	default:
		if a, err := netip.ParseAddr(ph); err == nil {
			// A zone (on either side) names no destination: never a match.
			b, err := netip.ParseAddr(host)
			return err == nil && a.Zone() == "" && b.Zone() == "" && a.Unmap() == b.Unmap()
		}
		return ph == host
	}
}

// limiter is a token bucket on an injected clock.
type limiter struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newLimiter(rate float64, burst int, now time.Time) *limiter {
	if rate <= 0 {
		return nil
	}
	b := float64(burst)
	if b < 1 {
		b = 1
	}
	return &limiter{rate: rate, burst: b, tokens: b, last: now}
}

// allow takes a token if one is available; a nil limiter always allows.
func (l *limiter) allow(now time.Time) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if dt := now.Sub(l.last).Seconds(); dt > 0 {
		l.tokens = min(l.burst, l.tokens+dt*l.rate)
		l.last = now
	}
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// bandwidth is a byte token bucket on the wall clock, shared by all of a
// sandbox's connections. A nil bandwidth never waits.
type bandwidth struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	tokens float64
	last   time.Time
}

func newBandwidth(bytesPerSecond int64) *bandwidth {
	if bytesPerSecond <= 0 {
		return nil
	}
	r := float64(bytesPerSecond)
	return &bandwidth{rate: r, tokens: r, last: time.Now()}
}

// wait takes n bytes from the bucket, sleeping until they are there (or
// ctx ends). Debt is allowed so a large write waits in proportion.
func (b *bandwidth) wait(ctx context.Context, n int) error {
	if b == nil || n <= 0 {
		return nil
	}
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	debt := -b.tokens
	b.mu.Unlock()
	if debt <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(debt / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shapedWriter charges every write to a bandwidth bucket first.
type shapedWriter struct {
	ctx context.Context
	w   io.Writer
	bw  *bandwidth
}

func (s shapedWriter) Write(p []byte) (int, error) {
	const chunk = 16 << 10 // smooth: never one long sleep for a big write
	n := 0
	for len(p) > 0 {
		c := min(len(p), chunk)
		if err := s.bw.wait(s.ctx, c); err != nil {
			return n, err
		}
		m, err := s.w.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}
