// Package egress is the network plumbing between a sandbox and the node's
// egress gateway (package gateway). It gives each sandbox exactly one way
// out, and that way ends in the daemon.
//
// # Topology
//
// Each sandbox has its own network namespace S (made by its driver). Egress
// adds a second namespace G per sandbox, pinned at <Dir>/<id>.netns, and a
// veth pair between them:
//
//	S: eth0      10.254.0.2/30, default route via 10.254.0.1
//	G: amber-gw  10.254.0.1/30, no route anywhere, forwarding off
//
// In G, nftables redirects every TCP connection that arrives on amber-gw to
// the daemon's listener (TCPPort) and every DNS query to the daemon's DNS
// responder (DNSPort); everything else is dropped. Both sockets are opened
// by the daemon inside G, so the daemon is the only thing a sandbox can
// reach: not the host, not another sandbox (each pair is alone in its own
// G), not the network. The daemon learns a connection's original
// destination with SO_ORIGINAL_DST and hands it to the gateway, which
// applies the sandbox's policy and dials out from the host's namespace.
// Every sandbox has the same addresses, so a checkpoint restored anywhere
// finds its own again.
//
// # Names
//
// The sandbox's resolv.conf names 10.254.0.1. Its DNS answers every A query
// with a stand-in address from 198.18.0.0/15 (RFC 2544 benchmarking space,
// never routed), chosen by a hash of the name and recorded in the sandbox's
// effect journal before the answer is sent; AAAA queries get no address.
// The gateway maps a stand-in back to its name and resolves the name
// itself, so the sandbox never learns a real address, and a restored
// sandbox that kept a stand-in in memory reaches the same name.
//
// # Lifetime
//
// Plumb is idempotent and is called by the driver on every create and
// restore, after it made S and before the sandbox starts (runsc copies S's
// interfaces and routes into its own network stack when it starts). The
// listeners are opened by Attach, again after a daemon restart (G and the
// veth outlive the daemon; the sockets do not, so a sandbox's connections
// are reset when the daemon dies, never left hanging). Detach closes them
// and removes G, which removes the veth.
//
// Package egress is also the egress group: the plumbing here and the
// gateway (internal/egress/gateway).
//
// May import: core, lib, internal/obs/tracing.
package egress

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/amber-run/amber/lib/netns"
)

// The fixed addressing of every sandbox's egress link (see the package doc).
const (
	SandboxIface = "eth0"
	GatewayIface = "amber-gw"
	// TCPPort and DNSPort are the daemon's sockets inside G.
	TCPPort = 15001
	DNSPort = 15053
)

var (
	SandboxAddr = netip.MustParsePrefix("10.254.0.2/30")
	GatewayAddr = netip.MustParseAddr("10.254.0.1")
	// StandIns is where DNS answers come from.
	StandIns = netip.MustParsePrefix("198.18.0.0/15")
)

// ResolvConf is the resolv.conf a sandbox needs to use the gateway's DNS.
const ResolvConf = "nameserver 10.254.0.1\noptions ndots:0 attempts:2 timeout:2\n"

// Plumb connects the sandbox namespace pinned at sbxNS to a gateway
// namespace pinned at gwNS, making whatever of G, the veth pair, their
// addresses, the default route and G's nftables rules is missing. It is
// idempotent: a restore calls it again on the same (or a remade) S.
func Plumb(sbxNS, gwNS string) error {
	if !netns.Pinned(gwNS) {
		if err := os.MkdirAll(filepath.Dir(gwNS), 0o700); err != nil {
			return err
		}
		_ = os.Remove(gwNS) // an unpinned leftover file
		if err := netns.Create(gwNS); err != nil {
			return err
		}
	}
	sfd, err := vnetns.GetFromPath(sbxNS)
	if err != nil {
		return fmt.Errorf("egress: sandbox namespace %s: %w", sbxNS, err)
	}
	defer sfd.Close()
	gfd, err := vnetns.GetFromPath(gwNS)
	if err != nil {
		return fmt.Errorf("egress: gateway namespace %s: %w", gwNS, err)
	}
	defer gfd.Close()
	sh, err := netlink.NewHandleAt(sfd)
	if err != nil {
		return fmt.Errorf("egress: netlink in %s: %w", sbxNS, err)
	}
	defer sh.Close()
	gh, err := netlink.NewHandleAt(gfd)
	if err != nil {
		return fmt.Errorf("egress: netlink in %s: %w", gwNS, err)
	}
	defer gh.Close()

	_, gerr := gh.LinkByName(GatewayIface)
	_, serr := sh.LinkByName(SandboxIface)
	if gerr != nil || serr != nil {
		// Half a pair (S or G was remade): start over.
		if l, err := gh.LinkByName(GatewayIface); err == nil {
			_ = gh.LinkDel(l)
		}
		if l, err := sh.LinkByName(SandboxIface); err == nil {
			_ = sh.LinkDel(l)
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: GatewayIface, MTU: 1500},
			PeerName:      SandboxIface,
			PeerNamespace: netlink.NsFd(int(sfd)),
		}
		if err := gh.LinkAdd(veth); err != nil {
			return fmt.Errorf("egress: veth %s/%s: %w", GatewayIface, SandboxIface, err)
		}
	}
	gl, err := gh.LinkByName(GatewayIface)
	if err != nil {
		return fmt.Errorf("egress: %s: %w", GatewayIface, err)
	}
	sl, err := sh.LinkByName(SandboxIface)
	if err != nil {
		return fmt.Errorf("egress: %s: %w", SandboxIface, err)
	}
	gwNet := &net.IPNet{IP: GatewayAddr.AsSlice(), Mask: net.CIDRMask(SandboxAddr.Bits(), 32)}
	if err := gh.AddrReplace(gl, &netlink.Addr{IPNet: gwNet}); err != nil {
		return fmt.Errorf("egress: address on %s: %w", GatewayIface, err)
	}
	if err := gh.LinkSetUp(gl); err != nil {
		return fmt.Errorf("egress: %s up: %w", GatewayIface, err)
	}
	sbNet := &net.IPNet{IP: SandboxAddr.Addr().AsSlice(), Mask: net.CIDRMask(SandboxAddr.Bits(), 32)}
	if err := sh.AddrReplace(sl, &netlink.Addr{IPNet: sbNet}); err != nil {
		return fmt.Errorf("egress: address on %s: %w", SandboxIface, err)
	}
	if err := sh.LinkSetUp(sl); err != nil {
		return fmt.Errorf("egress: %s up: %w", SandboxIface, err)
	}
	def := &netlink.Route{LinkIndex: sl.Attrs().Index, Gw: GatewayAddr.AsSlice(), Dst: nil}
	if err := sh.RouteReplace(def); err != nil {
		return fmt.Errorf("egress: default route: %w", err)
	}
	return applyRules(gwNS)
}

// rules is G's whole nftables ruleset: redirect TCP and DNS from the
// sandbox to the daemon's sockets, accept those, drop anything else.
var rules = fmt.Sprintf(`flush ruleset
table ip amber {
	chain sandbox_nat {
		type nat hook prerouting priority dstnat; policy accept;
		iifname %[1]q meta l4proto tcp redirect to :%[2]d
		iifname %[1]q udp dport 53 redirect to :%[3]d
	}
	chain sandbox_in {
		type filter hook input priority filter; policy drop;
		iifname "lo" accept
		ct state established,related accept
		iifname %[1]q tcp dport %[2]d accept
		iifname %[1]q udp dport %[3]d accept
	}
	chain sandbox_fwd {
		type filter hook forward priority filter; policy drop;
	}
}
`, GatewayIface, TCPPort, DNSPort)

// applyRules loads rules into the namespace pinned at gwNS (the whole
// ruleset is replaced atomically by one nft transaction).
func applyRules(gwNS string) error {
	cmd := exec.Command("nsenter", "--net="+gwNS, "nft", "-f", "-")
	cmd.Stdin = bytes.NewReader([]byte(rules))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("egress: nft in %s: %v: %s", gwNS, err, bytes.TrimSpace(out))
	}
	return nil
}

// Unplumb removes the gateway namespace pinned at gwNS; the veth pair goes
// with it (its sandbox end too).
func Unplumb(gwNS string) error {
	// Delete the pair first: the namespace itself is freed asynchronously
	// by the kernel, and the sandbox end should go now.
	if netns.Pinned(gwNS) {
		if fd, err := vnetns.GetFromPath(gwNS); err == nil {
			if h, err := netlink.NewHandleAt(fd); err == nil {
				if l, err := h.LinkByName(GatewayIface); err == nil {
					_ = h.LinkDel(l)
				}
				h.Close()
			}
			fd.Close()
		}
	}
	if err := netns.Remove(gwNS); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("egress: remove %s: %w", gwNS, err)
	}
	return nil
}

// listen opens the daemon's TCP listener and DNS socket inside the
// namespace pinned at gwNS.
func listen(gwNS string) (*net.TCPListener, *net.UDPConn, error) {
	var tl *net.TCPListener
	var uc *net.UDPConn
	err := netns.Do(gwNS, func() error {
		l, err := net.ListenTCP("tcp4", &net.TCPAddr{Port: TCPPort})
		if err != nil {
			return err
		}
		u, err := net.ListenUDP("udp4", &net.UDPAddr{Port: DNSPort})
		if err != nil {
			l.Close()
			return err
		}
		tl, uc = l, u
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("egress: listen in %s: %w", gwNS, err)
	}
	return tl, uc, nil
}
