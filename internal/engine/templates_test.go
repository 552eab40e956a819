package engine_test

import (
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
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/enginetest"
	"github.com/amber-run/amber/internal/templatestore"
)

// importRelease imports the minimal template's rootfs with
// /etc/amber-release reading release, as template name.
func importRelease(t *testing.T, cat *engine.Catalog, name, release string) templatestore.ImportResult {
	t.Helper()
	src, err := cat.Get("minimal")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	os.MkdirAll(filepath.Join(work, "etc"), 0o755)
	os.WriteFile(filepath.Join(work, "etc/amber-release"), []byte(release+"\n"), 0o644)
	// A reproducible build pins file times (mtimes are content).
	os.Chtimes(filepath.Join(work, "etc/amber-release"), time.Unix(1700000000, 0), time.Unix(1700000000, 0))
	tarPath := filepath.Join(work, "rootfs.tar")
	for _, args := range [][]string{
		{"-C", src.RootFS, "-cf", tarPath, "."},
		{"-C", work, "-rf", tarPath, "./etc/amber-release"},
	} {
		if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			t.Fatalf("tar %v: %v %s", args, err, out)
		}
	}
	f, err := os.Open(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := templatestore.Defaults{Env: src.Env, Cwd: src.Cwd, User: src.User}
	res, err := cat.Store().Import(context.Background(), name, f, d)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func release(t *testing.T, e *engine.Engine, id string) string {
	t.Helper()
	out, code := execOut(t, e, "default", id, "cat", "/etc/amber-release")
	if code != 0 {
		t.Fatalf("cat /etc/amber-release in %s: exit %d %q", id, code, out)
	}
	return strings.TrimSpace(out)
}

// otherBuild reports another runtime build than its driver's.
type otherBuild struct {
	sandbox.Driver
	sandbox.Checkpointer
}

func (otherBuild) RuntimeBuild(context.Context) (string, error) { return "runsc v0-other sha256:0000", nil }

// TestTemplateVersionPinnedRestore is the acceptance test: a
// checkpoint cut on version 1 of a template restores on version 1 after
// the template was rebuilt (version 2, tag moved; new sandboxes get 2),
// also after version 1's local copy is gone (fetched from the blob store);
// a manifest from another runtime build, or from a CPU with features this
// node lacks, is refused with a clear error and nothing runs.
func TestTemplateVersionPinnedRestore(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	e := env.Engine
	v1 := importRelease(t, env.Catalog, "tpl", "v1").Version

	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if sb.TemplateVersion != v1.Digest {
		t.Fatalf("sandbox born on %s, want %s", sb.TemplateVersion, v1.Digest)
	}
	if _, code := execOut(t, e, "default", sb.ID, "sh", "-c", "echo kept > /root/state"); code != 0 {
		t.Fatal("write state")
	}
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := env.Catalog.Store().Stored(ctx, v1.Digest); err != nil || !ok {
		t.Fatalf("version 1 is not in the blob store after a checkpoint on it: %v", err)
	}

	// Rebuild with a change: a new version, the tag moves.
	r2 := importRelease(t, env.Catalog, "tpl", "v2")
	if r2.Version.Digest == v1.Digest || r2.Previous != v1.Digest {
		t.Fatalf("rebuild: %+v", r2)
	}
	if again := importRelease(t, env.Catalog, "tpl", "v2"); !again.Existed || again.Version.Digest != r2.Version.Digest {
		t.Fatalf("re-import of identical content made %+v", again)
	}
	fresh, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.TemplateVersion != r2.Version.Digest || release(t, e, fresh.ID) != "v2" {
		t.Fatalf("a new sandbox got %s", fresh.TemplateVersion)
	}
	pinned, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl@" + v1.Digest, Cold: true})
	if err != nil || release(t, e, pinned.ID) != "v1" {
		t.Fatalf("create pinned to version 1: %v", err)
	}

	// The old checkpoint restores on the old version.
	fork, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true})
	if err != nil {
		t.Fatal(err)
	}
	if fork.TemplateVersion != v1.Digest || release(t, e, fork.ID) != "v1" {
		t.Fatalf("restored on %s reading %q, want version 1", fork.TemplateVersion, release(t, e, fork.ID))
	}
	if out, _ := execOut(t, e, "default", fork.ID, "cat", "/root/state"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("restored state %q", out)
	}

	// Nothing on this node uses version 1 any more: drop its local copy;
	// the next restore fetches it from the blob store.
	for _, id := range []string{sb.ID, fork.ID, pinned.ID} {
		if err := e.Destroy(ctx, "default", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Catalog.Store().Evict(v1.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v1.Path); !os.IsNotExist(err) {
		t.Fatalf("version 1's rootfs still at %s: %v", v1.Path, err)
	}
	back, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true})
	if err != nil {
		t.Fatal(err)
	}
	if release(t, e, back.ID) != "v1" {
		t.Fatal("restore after eviction is not on version 1")
	}
	if _, err := os.Stat(filepath.Join(v1.Path, "etc/amber-release")); err != nil {
		t.Fatalf("version 1 was not fetched back into the cache: %v", err)
	}
	if out, _ := execOut(t, e, "default", back.ID, "cat", "/root/state"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("state after fetch: %q", out)
	}
	e.Destroy(ctx, "default", back.ID)

	// Another runtime build: refused before anything runs.
	cp, _ := env.Driver.(sandbox.Checkpointer)
	realDriver := env.Driver
	env.Close(t)
	env.Driver = otherBuild{realDriver, cp}
	env.Restart(t)
	_, err = env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "runtime build") || !strings.Contains(err.Error(), "v0-other") {
		t.Fatalf("restore under another runtime build: %v, want a failed precondition naming the builds", err)
	}

	// A CPU without a feature the image was cut with: refused, naming it.
	env.Close(t)
	env.Driver = realDriver
	env.SetOptions(func(o *engine.Options) {
		o.CPUFeatures = func() ([]string, error) {
			have, err := engine.HostCPUFeatures()
			if len(have) == 0 {
				t.Skip("this host reports no CPU features")
			}
			return have[1:], err // the first one is missing
		}
	})
	env.Restart(t)
	have, _ := engine.HostCPUFeatures()
	_, err = env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "CPU") || !strings.Contains(err.Error(), have[0]) {
		t.Fatalf("restore on a CPU lacking %s: %v", have[0], err)
	}
	if sbs, _ := env.Engine.List(ctx, "default"); len(sbs) != 1 {
		t.Fatalf("refused restores left sandboxes: %+v", sbs)
	}
}
