package main

import (
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/criu"
)

// The criu driver: runc's libcontainer re-executes amber as the container
// init, so its hook must run first in main.
func init() {
	initHooks = append(initHooks, criu.InitIfRequested)
	driverFactories["criu"] = func(c driverConfig) (sandbox.Driver, error) {
		return criu.New(criu.Options{StateDir: c.StateDir, Logger: c.Logger, CgroupParent: c.CgroupParent, Network: c.Network})
	}
}
