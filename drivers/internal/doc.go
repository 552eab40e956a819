// Package internal holds what the drivers share and nobody else may use:
// drivers/internal/layer (the writable layer and its layer.tar archive),
// drivers/internal/confinedfs (file access confined to a sandbox's root),
// drivers/internal/procwait (exit files of started processes),
// drivers/internal/agent (the client of the in-sandbox agent, its builds),
// drivers/internal/hostproc (the host's /proc, for the orphan sweeps).
//
// May import: core, lib.
package internal
