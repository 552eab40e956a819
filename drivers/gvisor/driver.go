package gvisor

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/drivers/internal/lazyload"
	"github.com/amber-run/amber/lib/failpoint"
)

// Defaults for Options.
const (
	DefaultStateDir     = "/var/lib/amber/gvisor"
	DefaultCgroupParent = "/amber/gvisor"
	// PinnedVersion is the gvisor.dev/gvisor module version of the runsc
	// this driver is written and tested against (scripts/setup/runsc.sh
	// installs it). Check refuses any other build.
	PinnedVersion = "v0.0.0-20260905035102-160fafc42237"
	// PatchDigest is the first 12 hex digits of the sha256 of Amber's
	// patches to that source, scripts/setup/runsc-*.patch concatenated in
	// name order (TestPatchDigest recomputes it). runsc.sh links it into
	// the binary (-X …/runsc/version.amberPatches); Check refuses a build
	// without it, whose port-forward proxy drops the bytes a full netstack
	// send buffer did not take.
	PatchDigest = "f7854725f8a6"
)

// DefaultLimits apply where neither the spec nor the template sets a limit
// (the same numbers as the criu driver's, so a template behaves alike on
// both).
var DefaultLimits = sandbox.Limits{
	MemoryBytes: 512 << 20,
	MilliCPUs:   1000,
	Pids:        512,
	DiskBytes:   1 << 30,
}

// Options configure a Driver. Zero values take the defaults.
type Options struct {
	// StateDir holds everything the driver keeps (layout in the package
	// doc). Default DefaultStateDir.
	StateDir string
	// RunscPath is the runsc binary. Default:
	// ${AMBER_CACHE:-/var/cache/amber}/bin/runsc, what `make setup`
	// installs. A runsc found on PATH is never used.
	RunscPath string
	// CgroupParent is the cgroup (same path in every v1 hierarchy) under
	// which each sandbox gets <CgroupParent>/<id>. Default
	// DefaultCgroupParent.
	CgroupParent string
	// Limits override DefaultLimits field by field.
	Limits sandbox.Limits
	// Network, when set, connects each sandbox's namespace to the egress
	// gateway before the sandbox boots or is restored.
	Network sandbox.Network
	Logger  *slog.Logger
	// Failpoints, when set (tests), are evaluated by the layer archive
	// (layer.FPArchiveListed, layer.FPExtractMkdir).
	Failpoints *failpoint.Set
	// AgentBinary is the amber-agent that new sandboxes run as their init.
	// Default: agent.FindBinary() ($AMBER_AGENT, else amber-agent next to
	// the running executable). New copies it into the driver's agent
	// store (<StateDir>/agents), by digest.
	AgentBinary string
}

// Driver runs sandboxes with gVisor's runsc. It is safe for concurrent use:
// lifecycle calls (Create, Kill, Destroy) for one id are serialised, every
// other call runs in parallel.
type Driver struct {
	opts     Options
	log      *slog.Logger
	runsc    string
	root     string // runsc --root
	sbxDir   string // <StateDir>/sandboxes
	netnsDir string // <StateDir>/netns
	limits   sandbox.Limits
	// agents keeps every agent build a sandbox or checkpoint of this node
	// may name; agentBuild is the one New added, which Create gives new
	// sandboxes.
	agents     *agent.Store
	agentBuild string

	mu      sync.Mutex
	locks   map[string]*idLock
	clients map[string]*agentClient  // by sandbox id (agent.go)
	cuts    map[string]chan struct{} // sandboxes being cut: agent dials wait (holdAgentDials)
	dialing map[string]int           // agent dials in progress, by sandbox id
	// portConns are the DialPort connections open, by sandbox id: closed
	// before a cut (portdial.go).
	portConns map[string]map[*portConn]struct{}
	loads     map[string]*lazyload.Load // lazy restores still loading memory (lazy.go)
	calls     map[string]int            // runsc invocations by subcommand (runscCalls)
	// flags are the runtime flags new sandboxes get: runtimeFlags, or
	// RunscFlagsEnv's variant of them (flags.go).
	flags []string
}

type idLock struct {
	mu   sync.Mutex
	refs int
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
	if opts.RunscPath == "" {
		cache := os.Getenv("AMBER_CACHE")
		if cache == "" {
			cache = "/var/cache/amber"
		}
		opts.RunscPath = filepath.Join(cache, "bin", "runsc")
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = DefaultCgroupParent
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	abs, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	opts.StateDir = abs
	flags, err := sandboxFlagsFromEnv()
	if err != nil {
		return nil, err
	}
	d := &Driver{
		opts:      opts,
		log:       opts.Logger.With("driver", "gvisor"),
		runsc:     opts.RunscPath,
		root:      filepath.Join(abs, "runsc-root"),
		sbxDir:    filepath.Join(abs, "sandboxes"),
		netnsDir:  filepath.Join(abs, "netns"),
		limits:    mergeLimits(opts.Limits, DefaultLimits),
		locks:     map[string]*idLock{},
		clients:   map[string]*agentClient{},
		cuts:      map[string]chan struct{}{},
		dialing:   map[string]int{},
		loads:     map[string]*lazyload.Load{},
		portConns: map[string]map[*portConn]struct{}{},
		calls:     map[string]int{},
		flags:     flags,
	}
	for _, dir := range []string{d.root, d.sbxDir, d.netnsDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: state dir: %w", err)
		}
	}
	if err := d.openAgentStore(); err != nil {
		return nil, err
	}
	return d, nil
}

// Name implements sandbox.Driver.
func (d *Driver) Name() string { return "gvisor" }

// Capabilities implements sandbox.Driver. Checkpoint is runsc
// checkpoint/restore (checkpoint.go); outside TCP connections cannot survive
// a runsc restore (they are reset). LazyRestore is `runsc restore
// --background` (lazy.go).
func (d *Driver) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		Checkpoint:     true,
		LazyRestore:    true,
		LiveOutsideTCP: false,
		PTY:            true,
		PortForward:    true, // runsc port-forward --stream (portdial.go)
	}
}

// Check verifies that the pinned runsc is installed and boots a sandbox on
// the systrap platform. Every error names the command that fixes it.
func (d *Driver) Check(ctx context.Context) error {
	const fix = "run `make setup` (scripts/setup/runsc.sh installs it)"
	st, err := os.Stat(d.runsc)
	if err != nil {
		return errdefs.FailedPreconditionf("gvisor: runsc not found at %s: %v; %s", d.runsc, err, fix)
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return errdefs.FailedPreconditionf("gvisor: %s is not an executable file; %s", d.runsc, fix)
	}
	bi, err := buildinfo.ReadFile(d.runsc)
	if err != nil {
		return errdefs.FailedPreconditionf("gvisor: %s: cannot read its Go build info (%v); %s", d.runsc, err, fix)
	}
	if err := checkRunscBuild(bi); err != nil {
		return errdefs.FailedPreconditionf("gvisor: %s %v; %s", d.runsc, err, fix)
	}
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" && s.Value != "0" {
			return errdefs.FailedPreconditionf("gvisor: %s was built with CGO_ENABLED=%s; runsc must be static; %s", d.runsc, s.Value, fix)
		}
	}
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if _, err := os.Stat(filepath.Join(cgroupRoot, ctrl)); err != nil {
			return errdefs.FailedPreconditionf("gvisor: cgroup v1 controller %q is not mounted at %s: the driver needs cgroup v1 memory, cpu, cpuacct and pids", ctrl, filepath.Join(cgroupRoot, ctrl))
		}
	}
	// Boot a throwaway sandbox: proves the platform (systrap), the
	// runtime's namespaces and seccomp work on this kernel.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tmp, err := os.MkdirTemp("", "amber-gvisor-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	out, err := d.command(ctx, "--root="+filepath.Join(tmp, "root"), "--platform=systrap", "--network=none",
		"do", "--", "/bin/true").CombinedOutput()
	// `runsc do` leaves the gofer's null network namespace mounted under
	// its root.
	unmountAll(tmp)
	if err != nil {
		return errdefs.FailedPreconditionf("gvisor: `runsc --platform=systrap do /bin/true` failed: %v: %s; %s", err, strings.TrimSpace(string(out)), fix)
	}
	return nil
}

// idRE is the sandbox id syntax of core/sandbox.Spec.
var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,47}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.InvalidArgumentf("sandbox id %q: want [a-z0-9-], at most 48 bytes, not starting with '-'", id)
	}
	return nil
}

// lock serialises lifecycle calls for one id. The returned function
// unlocks.
func (d *Driver) lock(id string) func() {
	l := d.ref(id)
	l.mu.Lock()
	return func() { l.mu.Unlock(); d.unref(id, l) }
}

// tryLock is lock when id's lock is free at once (ok false: held).
func (d *Driver) tryLock(id string) (unlock func(), ok bool) {
	l := d.ref(id)
	if !l.mu.TryLock() {
		d.unref(id, l)
		return nil, false
	}
	return func() { l.mu.Unlock(); d.unref(id, l) }, true
}

// ref returns id's lock, made if needed, counted as in use.
func (d *Driver) ref(id string) *idLock {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.locks[id]
	if l == nil {
		l = &idLock{}
		d.locks[id] = l
	}
	l.refs++
	return l
}

// unref drops one use of id's lock l, forgetting it after the last.
func (d *Driver) unref(id string, l *idLock) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(d.locks, id)
	}
}

// mergeLimits fills each zero field of l from def.
func mergeLimits(l, def sandbox.Limits) sandbox.Limits {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.MilliCPUs == 0 {
		l.MilliCPUs = def.MilliCPUs
	}
	if l.Pids == 0 {
		l.Pids = def.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = def.DiskBytes
	}
	return l
}

// checkRunscBuild proves a runsc binary is the pinned source with Amber's
// patches: runsc.sh builds the patched copy of the module in place (so the
// main module is gvisor.dev/gvisor at "(devel)") and links the pin and the
// patches' digest into it (-X), which its -ldflags build setting records.
func checkRunscBuild(bi *buildinfo.BuildInfo) error {
	if bi.Main.Path != "gvisor.dev/gvisor" {
		return fmt.Errorf("is a build of %s, not of gvisor.dev/gvisor", bi.Main.Path)
	}
	var ldflags []string
	for _, s := range bi.Settings {
		if s.Key == "-ldflags" {
			ldflags = strings.Fields(s.Value)
		}
	}
	stamp := func(name string) string {
		for _, f := range ldflags {
			if v, ok := strings.CutPrefix(f, "gvisor.dev/gvisor/runsc/version."+name+"="); ok {
				return v
			}
		}
		return "none"
	}
	if v, p := stamp("version"), stamp("amberPatches"); v != PinnedVersion || p != PatchDigest {
		return fmt.Errorf("is gvisor.dev/gvisor %s with patches %s, this driver needs %s with patches %s (the pinned source with Amber's patches)", v, p, PinnedVersion, PatchDigest)
	}
	return nil
}
