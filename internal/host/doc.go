// Package host holds what guards a node's own process and data dir: the
// fencing of a stale writer (internal/host/fence) and the storage fault
// wrappers of tests and chaos runs (internal/host/faults).
//
// May import: core, lib.
package host
