//go:build cgo && seccomp

package criu

// seccompSupported: libcontainer's seccomp code (libseccomp, cgo) is linked.
const seccompSupported = true
