package engine_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/lib/failpoint"
)

// TestFilesExcludeCutAndRestore: the files API keeps out of a checkpoint's
// archive walk and of a restore's extraction of the layer. At the layer
// archive's failpoints — the walk has listed a directory; the extraction
// has made one — the sandbox's cut lock is held, and a file operation
// started there (a tenant racing the cut, e.g. to swap a directory for a
// symlink) has not run half a second later; it runs once the cut or the
// restore is done, and the checkpoint does not hold what it wrote.
func TestFilesExcludeCutAndRestore(t *testing.T) {
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) { testFilesExcludeCutAndRestore(t, drv) })
	}
}

func testFilesExcludeCutAndRestore(t *testing.T, drv string) {
	fp := failpoint.New()
	env := enginetest.NewWithDriverFailpoints(t, drv, engine.Options{}, fp)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	fs, err := e.Files(ctx, "default", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir(ctx, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(ctx, "/d/f", strings.NewReader("before"), 0o644); err != nil {
		t.Fatal(err)
	}

	// probe runs inside the driver, at a failpoint of the archive.
	var late []chan error
	probe := func(what string) {
		if !e.CutHeld(id) {
			t.Errorf("%s: the layer is walked without the cut lock", what)
		}
		done := make(chan error, 1)
		late = append(late, done)
		go func() {
			fs, err := e.Files(context.Background(), "default", id)
			if err == nil {
				err = fs.WriteFile(context.Background(), "/d/during-"+what, strings.NewReader("racing"), 0o644)
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Errorf("%s: a file operation ran while the layer was walked (err %v)", what, err)
			done <- err
		case <-time.After(500 * time.Millisecond):
		}
	}
	wait := func(what string) {
		t.Helper()
		select {
		case err := <-late[len(late)-1]:
			if err != nil {
				t.Errorf("%s: the file operation held back failed after: %v", what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: the file operation held back never ran", what)
		}
	}

	fp.ArmFunc(fpArchiveListed, 1, func(string) error { probe("cut"); return nil })
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	if fp.Hits(fpArchiveListed) == 0 {
		t.Fatal("the cut never walked the layer")
	}
	wait("cut")

	fp.ArmFunc(fpExtractMkdir, 1, func(string) error { probe("restore"); return nil })
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
		t.Fatal(err)
	}
	if fp.Hits(fpExtractMkdir) == 0 {
		t.Fatal("the restore never extracted a directory")
	}
	wait("restore")

	// The restored layer is the cut's, plus what the restore's racer
	// wrote after it: not what the cut's racer wrote after the walk.
	fs, err = e.Files(ctx, "default", id)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"/d/f": "before", "/d/during-restore": "racing"} {
		var b bytes.Buffer
		if err := fs.ReadFile(ctx, name, &b); err != nil || b.String() != want {
			t.Errorf("%s after the restore: %q %v, want %q", name, b.String(), err, want)
		}
	}
	if _, err := fs.Stat(ctx, "/d/during-cut"); err == nil {
		t.Error("the checkpoint holds a file written while its layer was walked")
	}
}

// The layer archive's failpoints (drivers/internal/layer: FPArchiveListed,
// FPExtractMkdir), named here as the drivers evaluate them; the test
// checks that each was hit, so a renamed point fails it.
const (
	fpArchiveListed = "layer.archive.listed"
	fpExtractMkdir  = "layer.archive.extract-mkdir"
)
