package main

import (
	"fmt"
	"github.com/amber-run/amber/internal/egress"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"

	"github.com/amber-run/amber/core/sandbox"
)

// driverConfig is what every driver constructor gets from `amber up`.
type driverConfig struct {
	// StateDir is DATA_DIR/drivers/<name>: the driver's state survives a
	// daemon restart there, so running sandboxes can be reattached.
	StateDir string
	Cache    string // $AMBER_CACHE: installed runtimes (bin/runsc, bin/criu)
	// Network is the egress plumbing (nil: sandboxes get loopback only).
	Network sandbox.Network
	Logger  *slog.Logger
	// CgroupParent, when set, replaces the driver's default cgroup parent
	// (a node on shared stores gets one of its own: sandbox ids are
	// cluster-wide, and two nodes may share a machine in tests).
	CgroupParent string
}

// driverFactories maps --driver names to constructors. Each driver registers
// itself from its own file (drivers_<name>.go) so that wiring a driver is
// one file here and nothing else.
var driverFactories = map[string]func(driverConfig) (sandbox.Driver, error){}

// initHooks run first thing in main (see main.go): a driver that
// re-executes the amber binary as a helper registers its entry point here.
var initHooks []func()

func runDriverInitHooks() {
	for _, h := range initHooks {
		h()
	}
}

func driverNames() []string {
	var names []string
	for n := range driverFactories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func newDriver(name, dataDir, cache string, network sandbox.Network, cgroupParent string, lg *slog.Logger) (sandbox.Driver, error) {
	f, ok := driverFactories[name]
	if !ok {
		return nil, usageError{fmt.Errorf("unknown driver %q (this amber has: %s)", name, strings.Join(driverNames(), ", "))}
	}
	if n, ok := network.(*egress.Network); ok && n == nil {
		network = nil // --egress=false: no network, not a nil one
	}
	return f(driverConfig{
		StateDir:     filepath.Join(dataDir, "drivers", name),
		Cache:        cache,
		Network:      network,
		Logger:       lg,
		CgroupParent: cgroupParent,
	})
}
