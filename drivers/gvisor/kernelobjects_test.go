package gvisor

import (
	"errors"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// TestFidelityKernelObjects: a zombie child, unix sockets on deleted
// paths, TCP connections with full send buffers (one sender blocked in
// send) and file locks (POSIX, flock, OFD) come back after a checkpoint, a
// kill and a restore. A FIFO held open after its path was deleted cannot
// be saved by gVisor: the checkpoint is refused with one line naming the
// FIFO (not runsc's dump) and the sandbox runs on.
func TestFidelityKernelObjects(t *testing.T) {
	runsc := requireHost(t)
	fidelitytest.KernelObjects(t, newTestDriver(t, runsc, "/amber/gvisor-kobj"), fidelitytest.PythonTemplate(t), "fifo")
}

// The message runsc gives for a deleted FIFO (as runsc of the pinned
// version printed it, its goroutine dump shortened) becomes one line.
func TestCheckpointErrorNamesADeletedFIFO(t *testing.T) {
	raw := &runscError{args: []string{"checkpoint"}, err: errors.New("exit status 128"),
		msg: "checkpoint failed: checkpointing container \"x_\": encoding error: gofer.dentry(\"ko.fifo\").beforeSave: dead dentry is not saved in fs.savedDeletedOpenDentries (deleted=true, synthetic=true):\ngoroutine 129 [running]:\ngvisor.dev/gvisor/pkg/state.Save(...)\n"}
	// The same cause as the control socket's answer (the cut's path).
	ctl := &controlError{method: ctlCheckpoint, msg: "encoding error: gofer.dentry(\"ko.fifo\").beforeSave: dead dentry is not saved in fs.savedDeletedOpenDentries (deleted=true, synthetic=true):\ngoroutine 129 [running]:\n"}
	for _, cause := range []error{raw, ctl} {
		err := checkpointError("sbx", cause)
		msg := err.Error()
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(msg, `FIFO named "ko.fifo"`) || strings.Contains(msg, "goroutine") || strings.Contains(msg, "\n") {
			t.Fatalf("checkpointError(%T) = %v", cause, err)
		}
	}
	other := &runscError{args: []string{"checkpoint"}, err: errors.New("exit status 1"), msg: "something else"}
	if err := checkpointError("sbx", other); !errors.As(err, new(*runscError)) {
		t.Fatalf("an unknown cause loses its runsc error: %v", err)
	}
}
