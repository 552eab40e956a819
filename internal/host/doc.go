// Package host holds what guards a node's own process and data dir: the
// fencing of a stale writer (internal/host/fence), the storage fault
// wrappers of tests and chaos runs (internal/host/faults), and taking a data
// dir over from a stopped daemon (internal/host/takeover).
//
// May import: core, lib.
package host
