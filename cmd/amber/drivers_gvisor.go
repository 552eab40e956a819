package main

import (
	"path/filepath"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/gvisor"
)

// The gvisor driver (the default): runsc from $AMBER_CACHE/bin.
func init() {
	driverFactories["gvisor"] = func(c driverConfig) (sandbox.Driver, error) {
		return gvisor.New(gvisor.Options{
			StateDir:     c.StateDir,
			RunscPath:    filepath.Join(c.Cache, "bin", "runsc"),
			Logger:       c.Logger,
			Network:      c.Network,
			CgroupParent: c.CgroupParent,
		})
	}
}
