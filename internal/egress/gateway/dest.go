package gateway

import (
	"net"
	"net/netip"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// maxHostName and maxLabel bound a host name (RFC 1035 2.3.4: 253 octets
// in text form, 63 per label). Longer names are refused before anything is
// decided or journaled.
const (
	maxHostName = 253
	maxLabel    = 63
)

// parseRequestHost returns the host of a request's Host (or absolute-form
// URL authority, or CONNECT target) in the form policy decisions use:
// lower-cased, without a trailing dot, an IP literal without brackets. It
// refuses what no destination can be: an IPv6 zone ("[::1%25eth0]", a
// '%' anywhere), a bracketed name, a name over 253 bytes or with a label
// over 63 (checkName). "" stays "" (no Host).
func parseRequestHost(hostport string) (string, error) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host = hostport[1 : len(hostport)-1]
	}
	if strings.Contains(host, "%") {
		return "", errdefs.InvalidArgumentf("host %.80q: an IPv6 zone (or a %% escape) names no destination", hostport)
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return "", nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String(), nil
	}
	if strings.ContainsAny(host, ":[]") {
		return "", errdefs.InvalidArgumentf("host %.80q: neither an IP address nor a name", hostport)
	}
	if err := checkName(host); err != nil {
		return "", err
	}
	return host, nil
}

// checkName validates a host name's shape: 1 to 253 bytes, labels of 1 to
// 63 bytes, no whitespace, control characters, '/', '@', '%' or '\'.
func checkName(name string) error {
	if name == "" || len(name) > maxHostName {
		return errdefs.InvalidArgumentf("host name of %d bytes: want 1 to %d", len(name), maxHostName)
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > maxLabel {
			return errdefs.InvalidArgumentf("host name %.80q: a label of %d bytes (want 1 to %d)", name, len(l), maxLabel)
		}
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == 0x7f || strings.IndexByte("/@%\\", c) >= 0 {
			return errdefs.InvalidArgumentf("host name %.80q: byte %q is not allowed", name, c)
		}
	}
	return nil
}

// CheckName is checkName for other packages (the sandbox DNS responder
// refuses such names before it journals them).
func CheckName(name string) error { return checkName(name) }
