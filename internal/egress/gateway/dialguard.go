package gateway

import (
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// GuardedDialer returns a dialer for connections the daemon opens on a
// tenant's behalf from the host's network (a model provider at a URL the
// tenant chose). Its check runs at dial time, on the address actually
// connected to after resolution, so a name that resolves (or re-resolves)
// into a denied network — loopback, the metadata address, the host's own
// addresses — is refused however it was spelled. p's DeniedNets and
// AllowNets apply; nil means the default deny list.
func GuardedDialer(p *Policy, timeout time.Duration) *net.Dialer {
	if p == nil {
		p = &Policy{}
	}
	return &net.Dialer{
		Timeout: timeout,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return errdefs.PermissionDeniedf("egress: refusing to dial %q: not an address", address)
			}
			if why := p.denyReason(ap.Addr()); why != "" {
				return errdefs.PermissionDeniedf("egress: refusing to dial %s: %s", ap, why)
			}
			return nil
		},
	}
}

// AddrDenied reports whether ip is refused by the default deny list: a
// zoned address, one in DefaultDeniedNets, an IPv6 address embedding a
// denied IPv4 address (NAT64, 6to4, IPv4-compatible; IPv4-mapped is its
// IPv4 address), or one of the host's own addresses (see Policy.denyReason).
func AddrDenied(ip netip.Addr) bool { return (&Policy{}).addrDenied(ip) }

// Allows reports whether p's allowlist lets a request reach host:port (the
// same match a sandbox's request meets; the deny list is decided on the
// address when it is dialled).
func (p *Policy) Allows(host string, port uint16) bool { return p.allowed(host, port) }
