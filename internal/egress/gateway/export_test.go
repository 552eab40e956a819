package gateway

import "net/netip"

// PretendHostAddrs makes the gateway treat addrs as the host's own, until
// the returned func is called.
func PretendHostAddrs(addrs ...netip.Addr) (undo func()) {
	hostAddrs.mu.Lock()
	defer hostAddrs.mu.Unlock()
	prev := hostAddrs.extra
	m := map[netip.Addr]bool{}
	for a := range prev {
		m[a] = true
	}
	for _, a := range addrs {
		m[a.Unmap()] = true
	}
	hostAddrs.extra = m
	return func() {
		hostAddrs.mu.Lock()
		hostAddrs.extra = prev
		hostAddrs.mu.Unlock()
	}
}

// DenyReason exposes Policy.denyReason to the tests.
func (p *Policy) DenyReason(ip netip.Addr) string { return p.denyReason(ip) }
