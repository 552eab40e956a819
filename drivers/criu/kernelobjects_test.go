package criu

import (
	"testing"

	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// TestFidelityKernelObjects: a zombie child, an unlinked FIFO, unix
// sockets on deleted paths, TCP connections with full send buffers and
// file locks (POSIX, flock, OFD) come back after a checkpoint, a kill and
// a restore.
func TestFidelityKernelObjects(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.KernelObjects(t, td, fidelitytest.PythonTemplate(t))
}
