package gateway

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// hostAddrsTTL is how long a reading of the host's interface addresses is
// used before it is read again (an address added to an interface is denied
// within this time; one in the default deny list, at once).
const hostAddrsTTL = 5 * time.Second

// hostAddrs is the host's own addresses, every interface's, as
// net.InterfaceAddrs reports them: a service bound to one (or to all) is
// the host's, and a sandbox reaching it through the gateway would be on
// the host's side of the sandbox boundary, whatever range the address is
// in. Read at first use and again when older than hostAddrsTTL; a failed
// read keeps the previous set.
var hostAddrs = struct {
	mu    sync.Mutex
	read  time.Time
	set   map[netip.Addr]bool
	extra map[netip.Addr]bool // tests: addresses the host is pretended to have
	list  func() ([]net.Addr, error)
}{list: net.InterfaceAddrs}

// isHostAddr reports whether ip (unzoned, unmapped) is one of the host's.
func isHostAddr(ip netip.Addr) bool {
	hostAddrs.mu.Lock()
	defer hostAddrs.mu.Unlock()
	if now := time.Now(); hostAddrs.set == nil || now.Sub(hostAddrs.read) > hostAddrsTTL {
		if as, err := hostAddrs.list(); err == nil || hostAddrs.set == nil {
			set := make(map[netip.Addr]bool, len(as))
			for _, a := range as {
				var ipb net.IP
				switch v := a.(type) {
				case *net.IPNet:
					ipb = v.IP
				case *net.IPAddr:
					ipb = v.IP
				}
				if x, ok := netip.AddrFromSlice(ipb); ok {
					set[x.Unmap()] = true
				}
			}
			hostAddrs.set = set
		}
		hostAddrs.read = now
	}
	return hostAddrs.set[ip] || hostAddrs.extra[ip]
}
