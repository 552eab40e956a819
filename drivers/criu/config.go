package criu

import (
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/opencontainers/cgroups"
	devices "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"

	"github.com/amber-run/amber/lib/agentproto"

	// Without it libcontainer cannot program the devices cgroup and
	// refuses a config with device rules.
	_ "github.com/opencontainers/cgroups/devices"
)

// defaultCaps is the whole capability set of sandbox root (bounding,
// permitted and effective; nothing inheritable or ambient). Every one of
// them only has power inside the sandbox's user namespace. Compared with
// Docker's default it drops CAP_NET_RAW (raw packets), CAP_MKNOD,
// CAP_SETFCAP, CAP_SYS_CHROOT and CAP_AUDIT_WRITE: package managers and
// build tools work without them.
var defaultCaps = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
}

// maskedPaths and readonlyPaths are runc's defaults: kernel information and
// knobs that are not namespaced.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// rootMountPoints are the destinations of containerConfig's mounts that
// lie in the layer itself (the others are inside /dev's tmpfs). Each must
// be a real directory of the layer, or absent, before the container is
// made (drivers/internal/layer.CheckMountPoints): libcontainer resolves them inside
// the root, but a symlinked one would still put a mount elsewhere than the
// sandbox expects (TestContainerConfigMountPoints keeps this list equal to
// the config's).
var rootMountPoints = []string{"/proc", "/dev", "/sys"}

// oomScoreAdj makes sandbox processes the kernel's preferred victims when
// the whole host runs out of memory (each sandbox's own limit is enforced by
// its memory cgroup first).
const oomScoreAdj = 500

// containerConfig is the libcontainer configuration of a sandbox. agentBin,
// when not empty, is the host file of the agent build the sandbox runs as
// its init: it is bound read-only (and nosuid, nodev) at agentproto.Path,
// inside /dev's tmpfs, so the mount point is a file of that tmpfs and never
// one of the writable layer (a checkpoint's layer.tar does not hold it, and
// the tenant cannot replace the binary the next restore execs). The file is
// mode 0555 owned by host root, in a directory sandbox root can search
// (agentBinary): sandbox root, an unprivileged host uid, reads and
// executes it as "other".
func (d *Driver) containerConfig(rec *record, rootfs, agentBin string) *configs.Config {
	const (
		noexecNosuidNodev = unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV
	)
	lim := rec.Limits
	period := uint64(100000)
	pids := lim.Pids
	// Deny every device, then allow the standard set (null, zero, full,
	// random, urandom, tty, ptmx, pts).
	rules := []*devices.Rule{{Type: devices.WildcardDevice, Major: devices.Wildcard, Minor: devices.Wildcard, Permissions: "rwm", Allow: false}}
	for _, dev := range specconv.AllowedDevices {
		rules = append(rules, &dev.Rule)
	}
	idmap := []configs.IDMap{{ContainerID: 0, HostID: int64(rec.HostID), Size: idsPerSandbox}}
	oom := oomScoreAdj
	caps := append([]string(nil), defaultCaps...)
	cfg := &configs.Config{
		Rootfs:   rootfs,
		Hostname: rec.ID,
		Namespaces: configs.Namespaces{
			{Type: configs.NEWUSER},
			{Type: configs.NEWNS},
			{Type: configs.NEWPID},
			{Type: configs.NEWIPC},
			{Type: configs.NEWUTS},
			{Type: configs.NEWNET},
			{Type: configs.NEWCGROUP},
			// A time namespace lets a restore on another host (or after
			// a reboot) keep CLOCK_MONOTONIC/BOOTTIME continuous.
			{Type: configs.NEWTIME},
		},
		UIDMappings: idmap,
		GIDMappings: idmap,
		Capabilities: &configs.Capabilities{
			Bounding:  caps,
			Effective: caps,
			Permitted: caps,
		},
		Mounts: []*configs.Mount{
			{Source: "proc", Destination: "/proc", Device: "proc", Flags: noexecNosuidNodev},
			{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
			{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
			{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: noexecNosuidNodev, Data: "mode=1777,size=65536k"},
			{Source: "mqueue", Destination: "/dev/mqueue", Device: "mqueue", Flags: noexecNosuidNodev},
			{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: noexecNosuidNodev | unix.MS_RDONLY},
		},
		Devices:       specconv.AllowedDevices,
		MaskPaths:     maskedPaths,
		ReadonlyPaths: readonlyPaths,
		Networks:      []*configs.Network{{Type: "loopback", Address: "127.0.0.1/0", Gateway: "localhost"}},
		Cgroups: &cgroups.Cgroup{
			Path: path.Join(d.opts.CgroupParent, rec.ID),
			Resources: &cgroups.Resources{
				Memory:     lim.MemoryBytes,
				MemorySwap: lim.MemoryBytes, // memory+swap == memory: no swap
				CpuQuota:   lim.MilliCPUs * int64(period) / 1000,
				CpuPeriod:  period,
				PidsLimit:  &pids,
				Devices:    rules,
			},
		},
		Rlimits: []configs.Rlimit{
			{Type: unix.RLIMIT_NOFILE, Soft: d.nofile, Hard: d.nofile},
			// No core dumps: when the host's core_pattern pipes to a
			// program, the kernel runs it on the host, as root.
			{Type: unix.RLIMIT_CORE, Soft: 0, Hard: 0},
		},
		OomScoreAdj:     &oom,
		NoNewPrivileges: true,
		NoNewKeyring:    true,
		Seccomp:         defaultSeccomp(),
		RootPropagation: unix.MS_PRIVATE | unix.MS_REC,
		Version:         "1.3.0",
		// libcontainer's Checkpoint/Restore pass this CRIU configuration
		// file (see criuConfig).
		Labels: []string{"org.criu.config=" + d.criuConfigPath()},
	}
	if agentBin != "" {
		// After /dev's tmpfs (and before anything else under /dev, which
		// keeps the order libcontainer mounts in).
		agentMount := &configs.Mount{
			Source:      agentBin,
			Destination: agentproto.Path,
			Device:      "bind",
			Flags:       unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV,
		}
		cfg.Mounts = slices.Insert(cfg.Mounts, 2, agentMount)
	}
	if d.nofile == 0 { // unknown: inherit the daemon's
		cfg.Rlimits = cfg.Rlimits[1:]
	}
	return cfg
}
