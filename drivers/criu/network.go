package criu

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// A sandbox's network. Every sandbox has a network namespace of its own,
// made by libcontainer with the sandbox's user namespace as its owner,
// loopback up; CRIU dumps its sockets with the tasks and, at a restore,
// makes the namespace again, empty, which the driver then sets up as it
// was (netnsimage.go: loopback, its addresses, the route) before CRIU
// restores a socket. Without Options.Network that is all: loopback only,
// no route anywhere.
//
// With Options.Network (the node's egress gateway), the driver has the
// Network plumb the namespace once the sandbox's init runs, on create and
// after every restore (Plumb is given /proc/<init>/ns/net): a veth pair,
// eth0 in the sandbox and amber-gw in the sandbox's gateway namespace
// (which the Network pins and keeps while the sandbox exists), the
// sandbox's address and default route. The driver then adds each address
// of the link to loopback as well (a /32): see below. Destroy unplumbs
// (the gateway namespace goes; the sandbox's namespace went with its
// tasks); a restore in place keeps the plumbing of the sandbox it
// replaces, so the gateway's ends of its connections are still there.
//
// Why not a namespace the driver pins and the container joins (as the
// gVisor driver does; libcontainer marks such a namespace external for
// CRIU): it would belong to the host's user namespace, and CRIU 4.1.1
// refuses to dump a task whose namespaces do not all belong to the task's
// own user namespace (check_user_ns: "Can't setns 9/net: Operation not
// permitted", "One or more namespaces doesn't belong to the target user
// namespace"); sandbox root could not mount its sysfs in it either.
// Sandbox root still has no CAP_NET_ADMIN over its namespace: its
// capability set has none (defaultCaps; no_new_privs keeps it so), and it
// may not make a user namespace inside (defaultSeccomp), whose
// capabilities would not reach a namespace of the one above anyway.
//
// The cut. CRIU cannot restore the veth: it would make the pair from
// inside the restored user namespace with its peer in the host's
// namespace ("net: Can't restore link": EPERM). So a checkpoint deletes
// the pair while the sandbox is frozen, before the dump, and plumbs it
// again before the thaw (a leave-running cut or a failed one). The
// sandbox's sockets stay bound to its address, which the loopback copy
// keeps local: image.json records it with loopback and the driver puts it
// back before CRIU restores the sockets (which it binds to it again). CRIU also connects each restored
// socket back to its peer, which needs a route ("Can't connect inet
// socket back: Network is unreachable"): while the link is away the
// default route is through loopback, where what the sockets send is
// dropped (not forwarded), until Plumb replaces it. The gateway's sockets, in the
// gateway namespace, never move: a restored connection of a planned
// move goes on once Plumb has made the link again (TCP retransmits what
// was sent meanwhile). With the link gone, nothing of the cut leaves the
// sandbox: no segment the gateway would acknowledge after the dump, and
// no FIN or reset when LeaveStopped kills the tasks (the gateway's end
// would close). After a crash instead the kernel closes the sandbox's
// sockets over the live link and the gateway ends its sides; a restore of
// an older cut then finds no peer, and the gateway namespace answers the
// restored socket's first segment with a reset.

// plumb connects sandbox id, whose init is pid, to the egress gateway
// (nothing without Options.Network) and copies the link's addresses to
// loopback.
func (d *Driver) plumb(ctx context.Context, id string, pid int) error {
	if d.opts.Network == nil {
		return nil
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", pid)
	if err := d.opts.Network.Plumb(ctx, id, ns); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return withNetlink(ns, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, l := range vethsIn(h) {
			addrs, err := h.AddrList(l, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				host := &net.IPNet{IP: a.IP, Mask: net.CIDRMask(32, 32)}
				if err := h.AddrReplace(lo, &netlink.Addr{IPNet: host}); err != nil {
					return fmt.Errorf("egress: %s on lo: %w", a.IP, err)
				}
			}
		}
		return nil
	})
}

// unplumb undoes plumb for sandbox id (Destroy; tolerates nothing there).
func (d *Driver) unplumb(ctx context.Context, id string) error {
	if d.opts.Network == nil {
		return nil
	}
	if err := d.opts.Network.Unplumb(ctx, id); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}

// dumpLink is the egress link of a sandbox being cut, deleted for the
// dump (unlinkForDump); the checkpoint's thaw restores it (a sandbox it
// kills instead needs none). A nil one (no Options.Network) does nothing.
type dumpLink struct {
	d    *Driver
	ctx  context.Context
	id   string
	pid  int
	done bool
}

// unlinkForDump deletes the veth of frozen sandbox id (init pid) before
// CRIU dumps it (see above). The link it returns restores the plumbing,
// also when unlinking failed half-way.
func (d *Driver) unlinkForDump(ctx context.Context, id string, pid int) (*dumpLink, error) {
	if d.opts.Network == nil {
		return nil, nil
	}
	err := withNetlink(fmt.Sprintf("/proc/%d/ns/net", pid), func(h *netlink.Handle) error {
		for _, l := range vethsIn(h) {
			if err := h.LinkDel(l); err != nil {
				return err
			}
		}
		// CRIU's restore connects each socket back (in repair mode),
		// which needs a route to its peer: the default route goes
		// through loopback until Plumb replaces it.
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
	})
	link := &dumpLink{d: d, ctx: context.WithoutCancel(ctx), id: id, pid: pid}
	if err != nil {
		return link, fmt.Errorf("egress: unlink for the dump: %w", err)
	}
	return link, nil
}

// restore plumbs the sandbox again, once.
func (l *dumpLink) restore() {
	if l == nil || l.done {
		return
	}
	l.done = true
	if err := l.d.plumb(l.ctx, l.id, l.pid); err != nil {
		l.d.log.Error("egress link after the dump; the sandbox has no way out", "sandbox", l.id, "err", err)
	}
}

// withNetlink runs fn with a netlink handle in the namespace at path.
func withNetlink(path string, fn func(*netlink.Handle) error) error {
	fd, err := vnetns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// vethsIn lists the veth links of h's namespace (the egress link).
func vethsIn(h *netlink.Handle) []netlink.Link {
	links, _ := h.LinkList()
	var out []netlink.Link
	for _, l := range links {
		if l.Type() == "veth" {
			out = append(out, l)
		}
	}
	return out
}
