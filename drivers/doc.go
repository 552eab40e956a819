// Package drivers holds the sandbox drivers, one folder each (drivers/gvisor,
// drivers/criu), implementing core/sandbox.Driver. Their shared helpers are in
// drivers/internal (Go's internal rule keeps them the drivers' own): the
// writable layer and its archive, confined file access, process exit files.
// A driver is a leaf: it knows nothing of the engine.
//
// May import: core, lib, drivers/internal.
package drivers
