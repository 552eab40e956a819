package criu

import (
	"testing"

	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// TestFidelityKernelObjects: a zombie child, an unlinked FIFO, a unix
// socket on a deleted path and a TCP connection with a full send buffer
// come back after a checkpoint, a kill and a restore.
func TestFidelityKernelObjects(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.KernelObjects(t, td, fidelitytest.PythonTemplate(t))
}
