package metadata

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// EgressPolicy is what a sandbox may reach through the egress gateway (the
// API's form of gateway.Policy). The zero policy reaches nothing.
type EgressPolicy struct {
	// Allow lists destinations as "host:port" patterns: a name,
	// "*.suffix", an IP literal or "*"; a port number or "*".
	Allow []string `json:"allow,omitempty"`
	// RequestsPerSecond and Burst bound HTTP requests and new streams; 0
	// means unlimited.
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	Burst             int     `json:"burst,omitempty"`
	// BytesPerSecond bounds egress bandwidth (both directions); 0: none.
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
	// Modes assign a crash mode to destinations: "idempotent-key",
	// "at-most-once" or "replay-safe" (gateway.Mode).
	Modes []EgressMode `json:"modes,omitempty"`
	// OnDivergence is "fail" (default) or "forward".
	OnDivergence string `json:"on_divergence,omitempty"`
}

// EgressMode assigns Mode to requests to Dest (a pattern as in Allow) with
// Method ("" for any).
type EgressMode struct {
	Dest   string `json:"dest"`
	Method string `json:"method,omitempty"`
	Mode   string `json:"mode"`
}

// Check validates p: patterns, modes and limits.
func (p EgressPolicy) Check() error {
	if len(p.Allow) > 1000 || len(p.Modes) > 1000 {
		return errdefs.InvalidArgumentf("egress policy: at most 1000 allow entries and 1000 modes")
	}
	for _, a := range p.Allow {
		if err := CheckDestPattern(a); err != nil {
			return err
		}
	}
	for _, m := range p.Modes {
		if err := CheckDestPattern(m.Dest); err != nil {
			return err
		}
		switch m.Mode {
		case "idempotent-key", "at-most-once", "replay-safe":
		default:
			return errdefs.InvalidArgumentf("egress mode %q for %s: want idempotent-key, at-most-once or replay-safe", m.Mode, m.Dest)
		}
	}
	switch p.OnDivergence {
	case "", "fail", "forward":
	default:
		return errdefs.InvalidArgumentf("egress on_divergence %q: want fail or forward", p.OnDivergence)
	}
	if p.BytesPerSecond < 0 {
		return errdefs.InvalidArgumentf("egress bytes_per_second %d: must not be negative", p.BytesPerSecond)
	}
	if p.RequestsPerSecond < 0 || p.RequestsPerSecond > 1e6 || p.Burst < 0 || p.Burst > 1e6 {
		return errdefs.InvalidArgumentf("egress rate %v/s burst %d: want 0 to 1000000", p.RequestsPerSecond, p.Burst)
	}
	return nil
}

// CheckDestPattern validates a "host:port" destination pattern.
func CheckDestPattern(s string) error {
	h, port, err := net.SplitHostPort(s)
	if err != nil || h == "" || port == "" {
		return errdefs.InvalidArgumentf("egress destination %q: want host:port (host a name, *.suffix, an IP or *; port a number or *)", s)
	}
	if port != "*" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return errdefs.InvalidArgumentf("egress destination %q: port %q is not 1-65535 or *", s, port)
		}
	}
	if h == "*" {
		return nil
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return errdefs.InvalidArgumentf("egress destination %q: an IPv6 zone names no destination", s)
		}
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	if len(name) > 253 || strings.ContainsAny(name, "*/%[]:@\\ \t") || strings.HasPrefix(name, ".") {
		return errdefs.InvalidArgumentf("egress destination %q: %q is not a host name", s, h)
	}
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if l == "" || len(l) > 63 {
			return errdefs.InvalidArgumentf("egress destination %q: %q is not a host name (labels of 1 to 63 bytes)", s, h)
		}
	}
	return nil
}
