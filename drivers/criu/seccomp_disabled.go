//go:build !cgo || !seccomp

package criu

// seccompSupported: built without -tags seccomp (or without cgo), so
// libcontainer cannot install a filter and the driver refuses to run.
const seccompSupported = false
