package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/lib/failpoint"
)

// Defaults for Options.
const (
	DefaultStateDir     = "/var/lib/amber/criu"
	DefaultRunDir       = "/run/amber-criu"
	DefaultCgroupParent = "/amber/criu"
	// DefaultUIDBase is the first host uid of the first sandbox's range:
	// 0x70000000 (1879048192). Ranges are handed out upwards from it, and
	// DefaultMaxSandboxes of them end at 0x7FFDFFFF. This lies above every
	// range useradd writes to /etc/subuid and /etc/subgid with the default
	// login.defs (SUB_UID_MIN 100000 to SUB_UID_MAX 600100000: the first
	// user's 100000–165535 in particular), above systemd's container ranges
	// (524288–1879048191) and below its foreign range (from 0x7FFE0000) and
	// 2^31, so no user's subordinate ids, and no systemd-allocated ones,
	// are ever a sandbox's. Before issue 18 the default was 100000
	// (legacyUIDBase): checkpoints made then still restore, into their own
	// range (see slotOf).
	DefaultUIDBase = 0x70000000
	// DefaultMaxSandboxes is the default number of uid ranges.
	DefaultMaxSandboxes = 4094
	// idsPerSandbox is the size of each sandbox's uid and gid range.
	idsPerSandbox = 65536
)

// DefaultLimits apply where neither the spec nor the template sets a limit.
var DefaultLimits = sandbox.Limits{
	MemoryBytes: 512 << 20,
	MilliCPUs:   1000,
	Pids:        512,
	DiskBytes:   1 << 30,
}

// Options configure a Driver. Zero values take the defaults above.
type Options struct {
	// StateDir holds the driver's state; see the package doc for its
	// layout. It is private to root (0700).
	StateDir string
	// RunDir holds one mount point per running sandbox, <RunDir>/<id>, the
	// root filesystem its processes see. Sandbox root (an unprivileged host
	// uid) must walk to it, so RunDir and its parents are searchable by
	// others (RunDir is made 0711; it is not listable). Keeping these
	// mounts out of StateDir lets StateDir stay private.
	RunDir string
	// CriuPath is the CRIU binary Check runs. Default:
	// ${AMBER_CACHE:-/var/cache/amber}/bin/criu, the patched build that
	// `make setup` installs. A criu found on PATH is never used for Check:
	// Debian 12's 3.17 does not start on this kernel.
	CriuPath string
	// CgroupParent is the cgroup (same path in every v1 hierarchy) under
	// which each sandbox gets <CgroupParent>/<id>.
	CgroupParent string
	// UIDBase is the first host uid (and gid) given to sandboxes; sandbox n
	// maps its ids 0..65535 to UIDBase+n·65536 onwards.
	UIDBase int
	// MaxSandboxes bounds the number of uid ranges (DefaultMaxSandboxes).
	MaxSandboxes int
	// Limits override DefaultLimits field by field.
	Limits sandbox.Limits
	Logger *slog.Logger
	// Failpoints, when set (tests), are evaluated by the layer archive
	// (layer.FPArchiveListed, layer.FPExtractMkdir).
	Failpoints *failpoint.Set
	// AgentBinary is the amber-agent binary new sandboxes run as their
	// init. Empty: agent.FindBinary ($AMBER_AGENT, else amber-agent next
	// to the executable). New copies it into the agent store
	// (<StateDir>/agents), which keeps every build a sandbox or a
	// checkpoint may still name.
	AgentBinary string
	// Network, when set, connects each sandbox to the node's egress
	// gateway: the driver has it plumb the sandbox's network namespace
	// once the init runs and after every restore, takes the link away
	// for each dump, and unplumbs on Destroy (network.go). Without it a
	// sandbox has loopback only.
	Network sandbox.Network
}

// Driver is the criu sandbox driver. It is safe for concurrent use.
type Driver struct {
	opts   Options
	log    *slog.Logger
	runc   string // libcontainer root: <StateDir>/runc
	sbxDir string // <StateDir>/sandboxes

	mu     sync.Mutex // guards locks and live
	locks  map[string]*sync.Mutex
	live   map[string]*liveSandbox
	agents map[string]*agent.Client // by sandbox id; guarded by mu
	cuts   map[string]chan struct{} // sandboxes being cut (quiesceAgent); guarded by mu
	nofile uint64

	// agentStore holds the agent builds; agentBuild is the one new
	// sandboxes run.
	agentStore *agent.Store
	agentBuild string

	uffdDevOnce sync.Once
	uffdDevOK   bool // uffdDev's answer, probed once

	// criuVer caches criuVersion's answer for one binary; guarded by mu.
	criuVer struct{ bin, version string }
}

var _ sandbox.Driver = (*Driver)(nil)

// New returns a driver keeping its state under opts.StateDir (created if
// missing). It does not check the host; Check does.
// SetFailpoints sets Options.Failpoints of a driver made without them
// (amber up arms its test failpoints after it made its driver). Call it
// before the driver is used; nil leaves them off.
func (d *Driver) SetFailpoints(fps *failpoint.Set) { d.opts.Failpoints = fps }

func New(opts Options) (*Driver, error) {
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	if opts.CriuPath == "" {
		cache := os.Getenv("AMBER_CACHE")
		if cache == "" {
			cache = "/var/cache/amber"
		}
		opts.CriuPath = filepath.Join(cache, "bin", "criu")
	}
	if opts.RunDir == "" {
		opts.RunDir = DefaultRunDir
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = DefaultCgroupParent
	}
	if opts.UIDBase == 0 {
		opts.UIDBase = DefaultUIDBase
	}
	if opts.MaxSandboxes == 0 {
		opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	abs, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	opts.StateDir = abs
	if opts.RunDir, err = filepath.Abs(opts.RunDir); err != nil {
		return nil, err
	}
	d := &Driver{
		opts:   opts,
		log:    opts.Logger.With("driver", "criu"),
		runc:   filepath.Join(abs, "runc"),
		sbxDir: filepath.Join(abs, "sandboxes"),
		locks:  map[string]*sync.Mutex{},
		live:   map[string]*liveSandbox{},
		agents: map[string]*agent.Client{},
		cuts:   map[string]chan struct{}{},
	}
	for _, dir := range []string{abs, d.runc, d.sbxDir, filepath.Join(abs, "slots")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("criu driver: %w", err)
		}
	}
	if err := os.MkdirAll(opts.RunDir, 0o711); err != nil {
		return nil, fmt.Errorf("criu driver: %w", err)
	}
	if err := os.Chmod(opts.RunDir, 0o711); err != nil {
		return nil, fmt.Errorf("criu driver: %w", err)
	}
	if err := searchableByAll(opts.RunDir); err != nil {
		return nil, fmt.Errorf("criu driver: run dir %s: %w", opts.RunDir, err)
	}
	if err := writeFileAtomic(d.criuConfigPath(), []byte(criuConfigFor(hostCgroupYard())), 0o644); err != nil {
		return nil, fmt.Errorf("criu driver: %w", err)
	}
	if err := d.initAgentStore(); err != nil {
		return nil, fmt.Errorf("criu driver: %w", err)
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		d.nofile = min(rl.Max, 65536)
	}
	return d, nil
}

// criuConfig is the CRIU configuration file every sandbox's
// checkpoint/restore uses: libcontainer hands its path to CRIU (settings in
// it override the RPC options), instead of the host's /etc/criu/runc.conf,
// which the driver does not control. `network-lock nftables`: CRIU locks
// the sandbox's network namespace while it dumps TCP connections with
// libnftables, in its own process; the default, iptables, ran
// iptables-restore processes, 48 ms of the frozen window of every cut here
// for the unlock alone (docs/benchmarks.md). A config file is the only way
// to choose it through libcontainer (its CriuOpts have no field); CRIU
// 4.1.1 crashed reading it in RPC mode, which
// scripts/setup/criu-4.1.1-network-lock-rpc.patch fixes. A restore takes
// the method from the image.
//
// The irmap scan paths: an inotify watch on the sandbox's overlay cannot be
// dumped by file handle (overlayfs without nfs_export does not decode
// handles: "fsnotify: Can't dump that handle"), so CRIU finds the watched
// inode's path by scanning directories of the sandbox's root ("irmap"),
// by default only /etc, /var/spool, /lib/udev. These are where programs'
// watched trees are (home and work directories); the scan runs only when a
// watch exists, inside the frozen window. A watch elsewhere still makes the
// checkpoint fail, with an error that says so (irmapError).
//
// `cgroup-yard` (when hostCgroupYard finds one): CRIU reads and sets the
// sandbox's cgroups through the host's own mounts of the hierarchies
// instead of mounting each one in a temporary yard of its own, which under
// cgroup v1 (ten hierarchies here) was 13 ms of every dump's frozen window.
var criuConfig = "network-lock nftables\n" + strings.Join(append([]string{""}, irmapScanPaths...), "\nirmap-scan-path ")[1:] + "\n"

// criuConfigFor is criuConfig with the cgroup yard (none when empty).
func criuConfigFor(yard string) string {
	if yard == "" {
		return criuConfig
	}
	return criuConfig + "cgroup-yard " + yard + "\n"
}

// hostCgroupYard returns /sys/fs/cgroup when it holds, under the names CRIU
// gives them, a mount of every cgroup hierarchy this process is in (what a
// sandbox's tasks are in too): CRIU opens <yard>/<controllers> for a
// hierarchy, <yard>/<name> for a name=<name> one and <yard>/unified for
// the v2 one, and fails the dump when one is missing. Otherwise "" (CRIU
// mounts its own yard, as without the option).
func hostCgroupYard() string {
	const yard = "/sys/fs/cgroup"
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return ""
		}
		name := strings.TrimPrefix(parts[1], "name=")
		if name == "" {
			name = "unified"
		}
		var st unix.Statfs_t
		if unix.Statfs(filepath.Join(yard, name), &st) != nil ||
			(st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC) {
			return ""
		}
	}
	return yard
}

// irmapScanPaths are the sandbox directories CRIU searches for the path of
// a watched inode (criuConfig).
var irmapScanPaths = []string{"/root", "/home", "/tmp", "/workspace", "/work", "/app", "/srv", "/opt", "/mnt", "/data", "/var/lib", "/usr/local"}

func (d *Driver) criuConfigPath() string { return filepath.Join(d.opts.StateDir, "criu.conf") }

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := fmt.Sprintf("%s.tmp.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// searchableByAll checks that every parent of dir has the search bit for
// others, which sandbox root (an unprivileged host uid) needs to reach the
// rootfs mounted below it.
func searchableByAll(dir string) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return errdefs.FailedPreconditionf("%s is not searchable by others (mode %v); sandboxes cannot reach their rootfs", p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

// Name implements sandbox.Driver.
func (d *Driver) Name() string { return "criu" }

// Capabilities implements sandbox.Driver. Checkpoint is CRIU through
// libcontainer (checkpoint.go); CRIU restores live TCP (TCP_REPAIR).
// LazyRestore (`criu lazy-pages`, see startLazyPages) needs the restored
// tasks to create their userfaultfd inside the sandbox's user namespace,
// which userfaultfd(2) refuses (EPERM) while vm.unprivileged_userfaultfd is
// 0. The patched CRIU (scripts/setup/criu-4.1.1-uffd-dev.patch) creates it
// through the root-only /dev/userfaultfd instead: `criu lazy-pages`, root
// and outside the sandbox's cgroups (whose device controller denies the
// device to the restoring CRIU), opens it and hands it to the restore over
// the lazy-pages socket in the root-only work directory; every restored
// task closes it before restored code runs. So the sysctl, a host-wide
// relaxation, stays 0. LazyRestore is true when that works (uffdDev) or
// the sysctl is 1; otherwise RestoreOptions.Lazy is ignored.
func (d *Driver) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		Checkpoint:     true,
		LazyRestore:    unprivilegedUserfaultfd() || d.uffdDev(),
		LiveOutsideTCP: true,
		PTY:            true,
		PortForward:    true,
	}
}

func unprivilegedUserfaultfd() bool {
	b, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// uffdDev reports whether Options.CriuPath creates userfaultfds through
// /dev/userfaultfd and the device works here: `criu check --feature
// uffd-dev`, which an unpatched CRIU does not know. Probed once per driver
// (the binary and the device do not change under a running daemon).
func (d *Driver) uffdDev() bool {
	d.uffdDevOnce.Do(func() {
		if _, err := os.Stat("/dev/userfaultfd"); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.uffdDevOK = exec.CommandContext(ctx, d.opts.CriuPath, "check", "--feature", "uffd-dev").Run() == nil
	})
	return d.uffdDevOK
}

// setupHint is the command that installs what Check finds missing.
const setupHint = "run `make setup` (scripts/setup/criu.sh builds the patched CRIU into $AMBER_CACHE/bin)"

// Check implements sandbox.Driver: the binary was built with seccomp
// support, the cgroup v1 controllers the driver uses are mounted, and the
// patched CRIU at Options.CriuPath passes `criu check`.
func (d *Driver) Check(ctx context.Context) error {
	if !seccompSupported {
		return errdefs.FailedPreconditionf("criu driver: this binary was built without seccomp support; build with CGO_ENABLED=1 -tags seccomp (libseccomp-dev installed)")
	}
	if os.Geteuid() != 0 {
		return errdefs.FailedPreconditionf("criu driver: needs root (uid 0), running as uid %d", os.Geteuid())
	}
	for _, c := range []string{"memory", "cpu", "pids", "freezer", "devices"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "cgroup.procs")); err != nil {
			return errdefs.FailedPreconditionf("criu driver: cgroup v1 controller %q not mounted at /sys/fs/cgroup/%s", c, c)
		}
	}
	fi, err := os.Stat(d.opts.CriuPath)
	if err != nil {
		return errdefs.FailedPreconditionf("criu driver: CRIU not found at %s: %s", d.opts.CriuPath, setupHint)
	}
	if fi.Mode()&0o111 == 0 {
		return errdefs.FailedPreconditionf("criu driver: %s is not executable: %s", d.opts.CriuPath, setupHint)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.opts.CriuPath, "--version").CombinedOutput()
	if err != nil {
		return errdefs.FailedPreconditionf("criu driver: %s --version: %v: %s; %s", d.opts.CriuPath, err, bytes.TrimSpace(out), setupHint)
	}
	if v := criuVersion(string(out)); v != "" && !versionAtLeast(v, 4, 1) {
		return errdefs.FailedPreconditionf("criu driver: %s is CRIU %s, need >= 4.1: %s", d.opts.CriuPath, v, setupHint)
	}
	out, err = exec.CommandContext(ctx, d.opts.CriuPath, "check").CombinedOutput()
	if err != nil {
		return errdefs.FailedPreconditionf("criu driver: `%s check` failed: %v: %s; %s", d.opts.CriuPath, err, lastLines(out, 5), setupHint)
	}
	return nil
}

var criuVersionRE = regexp.MustCompile(`Version: ([0-9]+(?:\.[0-9]+)*)`)

func criuVersion(out string) string {
	m := criuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return m[1]
}

func versionAtLeast(v string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(v, "%d.%d", &ma, &mi); err != nil {
		// "4" alone
		if _, err := fmt.Sscanf(v, "%d", &ma); err != nil {
			return false
		}
	}
	return ma > major || ma == major && mi >= minor
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// lock serializes lifecycle calls (Create, Kill, Destroy) for one id.
func (d *Driver) lock(id string) func() {
	l := d.lockOf(id)
	l.Lock()
	return l.Unlock
}

// lockOf is id's lifecycle lock.
func (d *Driver) lockOf(id string) *sync.Mutex {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.locks[id]
	if !ok {
		l = &sync.Mutex{}
		d.locks[id] = l
	}
	return l
}

var idRE = regexp.MustCompile(`^[a-z0-9-]{1,48}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.InvalidArgumentf("sandbox id %q: want [a-z0-9-], 1 to 48 bytes", id)
	}
	return nil
}

func isNotExist(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT)
}
