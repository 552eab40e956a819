package criu

import (
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The sandbox's network namespace in a checkpoint. CRIU dumps it as an
// empty one (--empty-ns net): no links, addresses, routes, rules,
// iptables or nftables of it, no sysctls. Dumping them cost eight `ip`
// and iptables-save processes and the reading of every sysctl of each
// link, 37 ms of a cut's frozen window here, and a restore ran as many
// `ip` and iptables-restore processes to put them back (dump.log and
// restore.log, docs/benchmarks.md). None of it is the sandbox's to
// change: sandbox root has no CAP_NET_ADMIN over its namespace and
// /proc/sys is read-only (network.go), so what the namespace holds at a
// cut is what this driver put there: loopback up, the copies of the egress
// address on loopback (plumb) and, while the link is away for the dump,
// the default route through loopback (unlinkForDump). The driver records
// that in image.json (netnsImage, read from the frozen sandbox's
// namespace) and makes it again itself: CRIU creates the restored
// namespace (owned by the restored user namespace, as before), calls the
// setup-namespaces action, which libcontainer runs as the restore
// config's CreateRuntime hooks, before it restores a single socket, and
// the hook (netnsSetupHook) brings loopback up and adds the addresses and
// the route. The egress link follows after the restore, as before.
//
// An image without the record (made before this) was dumped with its
// namespace and restores the old way.

// netnsImage is what a sandbox's network namespace held at a cut.
type netnsImage struct {
	// Loopback lists loopback's addresses (CIDR) beside 127.0.0.1/8 and
	// ::1/128, which bringing it up adds.
	Loopback []string `json:"loopback,omitempty"`
	// DefaultViaLoopback: the IPv4 default route goes through loopback.
	DefaultViaLoopback bool `json:"default_via_loopback,omitempty"`
}

// readNetns reads the namespace of pid (the frozen sandbox's init).
func readNetns(pid int) (*netnsImage, error) {
	img := &netnsImage{}
	err := withNetlink(fmt.Sprintf("/proc/%d/ns/net", pid), func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("loopback is down")
		}
		addrs, err := h.AddrList(lo, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if s := a.IPNet.String(); s != "127.0.0.1/8" && s != "::1/128" {
				img.Loopback = append(img.Loopback, s)
			}
		}
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
				if r.LinkIndex != lo.Attrs().Index {
					return fmt.Errorf("a default route through link %d, not loopback", r.LinkIndex)
				}
				img.DefaultViaLoopback = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the network namespace: %w", err)
	}
	return img, nil
}

// setup makes img in the namespace of pid (the restored sandbox's init,
// its namespaces created, nothing restored in them yet).
func (img *netnsImage) setup(pid int) error {
	return withNetlink(fmt.Sprintf("/proc/%d/ns/net", pid), func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return fmt.Errorf("loopback up: %w", err)
		}
		for _, s := range img.Loopback {
			a, err := netlink.ParseAddr(s)
			if err != nil {
				return fmt.Errorf("loopback address %q: %w", s, err)
			}
			if err := h.AddrReplace(lo, a); err != nil {
				return fmt.Errorf("loopback address %s: %w", s, err)
			}
		}
		if img.DefaultViaLoopback {
			if err := h.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
				return fmt.Errorf("default route through loopback: %w", err)
			}
		}
		return nil
	})
}

// setupHook is the restore config's hooks for an image whose namespace
// is img: one that makes img in the namespace CRIU created (libcontainer
// runs it at CRIU's setup-namespaces notification with the root task's
// host pid). None for a nil img (CRIU restores the namespace it dumped).
func (img *netnsImage) setupHook() configs.Hooks {
	if img == nil {
		return nil
	}
	quietFuncHookWarnings()
	return configs.Hooks{configs.CreateRuntime: {configs.NewFunctionHook(func(s *specs.State) error {
		if s.Pid <= 0 {
			return fmt.Errorf("criu restore: setup-namespaces without the root task's pid")
		}
		if err := img.setup(s.Pid); err != nil {
			return fmt.Errorf("criu restore: network namespace: %w", err)
		}
		return nil
	})}}
}

// emptyNs is CriuOpts.EmptyNs for a dump or restore of img: the network
// namespace, empty, when the driver makes it; nothing for a nil img.
func (img *netnsImage) emptyNs() uint32 {
	if img == nil {
		return 0
	}
	return unix.CLONE_NEWNET
}

// readNetnsForDump is readNetns, or nil when testDumpNetns asks for an
// image of format 2.
func readNetnsForDump(pid int) (*netnsImage, error) {
	if testDumpNetns {
		return nil, nil
	}
	return readNetns(pid)
}

// testDumpNetns makes Checkpoint write an image as the driver did before
// netnsImage (CRIU dumps the namespace; format 2), for the test that
// such an image still restores.
var testDumpNetns bool

// quietFuncHookWarning drops libcontainer's warning that a function hook
// is not saved in the container's state (the restore's netns hook is meant
// for that restore only), printed at every save of a restoring container;
// libcontainer logs through logrus's standard logger, whose other entries
// pass through Format unchanged.
type quietFuncHookWarning struct{ logrus.Formatter }

func (f quietFuncHookWarning) Format(e *logrus.Entry) ([]byte, error) {
	if strings.HasPrefix(e.Message, "cannot serialize hook of type configs.FuncHook") {
		return nil, nil
	}
	return f.Formatter.Format(e)
}

var quietOnce sync.Once

// quietFuncHookWarnings installs quietFuncHookWarning, once.
func quietFuncHookWarnings() {
	quietOnce.Do(func() {
		logrus.SetFormatter(quietFuncHookWarning{logrus.StandardLogger().Formatter})
	})
}
