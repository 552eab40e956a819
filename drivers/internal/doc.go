// Package internal holds what the drivers share and nobody else may use:
// drivers/internal/layer (the writable layer and its layer.tar archive),
// drivers/internal/confinedfs (file access confined to a sandbox's root),
// drivers/internal/procwait (exit files of started processes).
//
// May import: core, lib.
package internal
