package criu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// vforkChildSleeps vforks a child that sleeps before it would exec, the
// parent waiting for it in kernel_clone: a vfork CRIU can never seize.
const vforkChildSleeps = `#include <unistd.h>
#include <time.h>
#include <sys/syscall.h>
int main(void) {
	if (vfork() == 0) {
		struct timespec ts = {600, 0};
		syscall(SYS_nanosleep, &ts, 0);
		_exit(0);
	}
	return 0;
}
`

// TestCheckpointThroughVfork: a task waiting in vfork for its child's exec
// made CRIU's seize time out after 10 s (CI: TestAgentHeldIn/drop, "Unseizable
// non-zombie …, state D", a dash loop's vfork caught by the freeze). A
// shell that vforks all the time is checkpointed again and again; a vfork
// whose child never execs fails the checkpoint at once with an error that
// names it, the sandbox thawed, alone and running.
func TestCheckpointThroughVfork(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	id := newID("vfork")
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: pythonTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	// dash runs an outside command through vfork: two loops keep a vfork
	// in progress most of the time.
	for i := 0; i < 2; i++ {
		if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "while :; do /bin/true; done"}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	before := vforkThaws.Load()
	for i := 0; i < 8; i++ {
		start := time.Now()
		if _, err := td.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img"), sandbox.CheckpointOptions{}); err != nil {
			t.Fatalf("checkpoint %d of a vforking shell: %v", i, err)
		}
		if el := time.Since(start); el > 8*time.Second {
			t.Fatalf("checkpoint %d took %v: a seize waited", i, el)
		}
	}
	t.Logf("8 checkpoints of a vforking shell; freezes thawed for a vfork in progress: %d", vforkThaws.Load()-before)

	bin := buildStatic(t, vforkChildSleeps)
	var out bytes.Buffer
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "cat > /tmp/vf && chmod +x /tmp/vf"}, Stdin: bytes.NewReader(data), Stderr: &out})
	if err != nil || st.Code != 0 {
		t.Fatalf("copy the program in: %+v %v %s", st, err, out.String())
	}
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/tmp/vf"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	_, err = td.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img"), sandbox.CheckpointOptions{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "vfork") || !strings.Contains(err.Error(), "vf (pid") {
		t.Fatalf("checkpoint with a vfork that never execs (pid %d): %v after %v", pid, err, time.Since(start))
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the refusal took %v", el)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assertThawedAndAlone(t, td.Driver, id)
}

// buildStatic compiles C source src into a static program for the
// sandbox (gcc and Debian's libc6-dev, on every machine of this kind).
func buildStatic(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	c := filepath.Join(dir, "p.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "p")
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc -static: %v\n%s", err, out)
	}
	return bin
}
