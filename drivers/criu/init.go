package criu

import (
	"os"
	"runtime"

	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor sets up namespaces for libcontainer's
	// re-exec init before the Go runtime starts; it does nothing in a
	// process that is not such an init.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// Keep the main goroutine on the main thread for the life of the process.
//
// libcontainer's Run starts a goroutine that locks its OS thread, joins the
// new container's mount namespace and exits without unlocking, so that the
// Go runtime kills the thread. If that goroutine lands on the main thread,
// which the runtime cannot kill, the thread is parked for good — still in
// the container's mount namespace. /proc/self then shows that namespace,
// and the namespace (with the sandbox's overlay and layer mounts) can never
// be freed. Locking the main goroutine to the main thread in an init
// function keeps every other goroutine off it. The cost: main's goroutine
// always runs on thread 1, which only matters for programs that need their
// main goroutine on some other thread (none here).
func init() { runtime.LockOSThread() }

// initArg is the argument libcontainer re-executes the binary with.
const initArg = "init"

// InitIfRequested runs libcontainer's container init when the current
// process is one (libcontainer re-executes the binary as "<argv0> init" with
// _LIBCONTAINER_INITPIPE set); it never returns then. In any other process
// it returns at once.
//
// Call it first thing in main (cmd/amber) and in TestMain of any test binary
// that creates criu sandboxes:
//
//	func main() {
//		criu.InitIfRequested()
//		...
//	}
func InitIfRequested() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case initArg:
		if os.Getenv("_LIBCONTAINER_INITPIPE") == "" {
			return // a user's "amber init", not libcontainer's
		}
		libcontainer.Init() // never returns
	}
}
