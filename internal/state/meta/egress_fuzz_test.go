package meta

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzCheckDestPattern: a pattern checkDestPattern accepts is one the
// gateway can match as written: host:port; the host "*", an IP address
// without a zone, or a name (optionally "*."-prefixed) of 1 to 253 bytes
// in labels of 1 to 63 bytes; the port "*" or 1-65535.
func FuzzCheckDestPattern(f *testing.F) {
	for _, s := range []string{"api.example.com:443", "*.example.com:*", "*:*", "[::1]:80", "[fe80::1%eth0]:80",
		"[::1%25x]:1", "a..b:1", "*.:1", strings.Repeat("a", 64) + ".test:1", "h:0", "h:65536", ":1", "1.2.3.4:*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if checkDestPattern(s) != nil {
			return
		}
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			t.Fatalf("%q accepted: not host:port", s)
		}
		if p != "*" {
			if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
				t.Fatalf("%q accepted: port %q", s, p)
			}
		}
		if h == "*" {
			return
		}
		if a, err := netip.ParseAddr(h); err == nil {
			if a.Zone() != "" {
				t.Fatalf("%q accepted: a zoned address", s)
			}
			return
		}
		name := strings.TrimPrefix(h, "*.")
		if name == "" || len(name) > 253 || strings.ContainsAny(name, "*/%[]: \t@\\") {
			t.Fatalf("%q accepted: %q is no host name", s, name)
		}
		for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
			if l == "" || len(l) > 63 {
				t.Fatalf("%q accepted: label %q", s, l)
			}
		}
	})
}
