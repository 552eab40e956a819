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
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/internal/state/templatestore"
	"github.com/amber-run/amber/stores/localfs"
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

func (otherBuild) RuntimeBuild(context.Context) (string, error) {
	return "runsc v0-other sha256:0000", nil
}

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

	// The old checkpoint restores on the old version (in place: the criu
	// driver restores into the image's uid range, which sb holds).
	if _, code := execOut(t, e, "default", sb.ID, "sh", "-c", "echo lost > /root/state"); code != 0 {
		t.Fatal("overwrite state")
	}
	back, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID})
	if err != nil {
		t.Fatal(err)
	}
	if back.TemplateVersion != v1.Digest || release(t, e, sb.ID) != "v1" {
		t.Fatalf("restored on %s reading %q, want version 1", back.TemplateVersion, release(t, e, sb.ID))
	}
	if out, _ := execOut(t, e, "default", sb.ID, "cat", "/root/state"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("restored state %q", out)
	}

	// Nothing on this node uses version 1 any more: drop its local copy;
	// the next restore fetches it from the blob store.
	for _, id := range []string{sb.ID, pinned.ID} {
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
	back, err = e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID, AsNew: true})
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

// TestTemplateUpgradeRemoveGC: a sandbox upgraded to a new version keeps
// its files (new, changed, deleted) on the new version's files, boots
// fresh, and both streams record it; a referenced version cannot be
// removed (the error says by what); collection removes only versions
// nothing references.
func TestTemplateUpgradeRemoveGC(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	e := env.Engine
	v1 := importRelease(t, env.Catalog, "tpl", "v1").Version
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl", Cold: true, Env: []string{"MINE=1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, code := execOut(t, e, "default", sb.ID, "sh", "-c",
		"mkdir -p /root/work && echo data > /root/work/data && chmod 600 /root/work/data && ln -s data /root/work/link && rm /etc/group && echo changed > /etc/hosts"); code != 0 {
		t.Fatal("prepare files")
	}
	// A file of 1 MiB or more is a blob of the checkpoint's layer archive
	// (drivers/internal/layer, blobs.go): the upgrade reads its bytes from
	// the image's layer-blobs/.
	bigSum, code := execOut(t, e, "default", sb.ID, "sh", "-c", "dd if=/dev/urandom of=/root/work/big bs=1024 count=3000 2>/dev/null && sha256sum /root/work/big")
	if code != 0 {
		t.Fatal("write the large file")
	}
	v2 := importRelease(t, env.Catalog, "tpl", "v2").Version

	// v1 is referenced by the sandbox: not removable.
	err = e.RemoveTemplate(ctx, "tpl@"+v1.Digest)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("rm of a version a sandbox uses: %v", err)
	}
	err = e.RemoveTemplate(ctx, v2.Digest)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "tag tpl") {
		t.Fatalf("rm of a tagged version: %v", err)
	}

	up, err := e.Upgrade(ctx, engine.UpgradeRequest{Tenant: "default", Sandbox: sb.ID, Template: "tpl@" + v2.Digest})
	if err != nil {
		t.Fatal(err)
	}
	if up.TemplateVersion != v2.Digest || release(t, e, up.ID) != "v2" {
		t.Fatalf("upgraded sandbox on %s", up.TemplateVersion)
	}
	out, _ := execOut(t, e, "default", up.ID, "sh", "-c",
		"cat /root/work/data; readlink /root/work/link; stat -c %a /root/work/data; cat /etc/hosts; test -e /etc/group && echo group-back; echo MINE=$MINE")
	if want := "data\ndata\n600\nchanged\nMINE=1\n"; out != want {
		t.Fatalf("upgraded sandbox's files:\n%q\nwant\n%q", out, want)
	}
	if got, _ := execOut(t, e, "default", up.ID, "sha256sum", "/root/work/big"); got != bigSum {
		t.Fatalf("upgraded sandbox's large file: %q, was %q", got, bigSum)
	}
	old, err := e.Get(ctx, "default", sb.ID)
	if err != nil || old.State != "stopped" {
		t.Fatalf("the old sandbox after the upgrade: %+v %v", old, err)
	}
	for _, id := range []string{sb.ID, up.ID} {
		evs, err := env.Log.Read(ctx, engine.Stream(id), 1, 100)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs {
			found = found || (ev.Type == engine.EventUpgraded && strings.Contains(string(ev.Payload), v2.Digest))
		}
		if !found {
			t.Errorf("stream of %s has no sandbox.upgraded", id)
		}
	}

	// v1 is still referenced by the stopped sandbox and its pre-upgrade
	// checkpoint; an unreferenced third version is collected, v1 and v2
	// are not.
	v3 := importRelease(t, env.Catalog, "tmp", "v3").Version
	if _, err := e.TagTemplate(ctx, "tpl", v2.Digest); err != nil {
		t.Fatal(err)
	}
	if err := e.RemoveTemplate(ctx, "tmp"); err != nil {
		t.Fatal(err)
	}
	removed, err := e.GCTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range removed {
		if d == v1.Digest || d == v2.Digest {
			t.Errorf("gc removed referenced version %s", d)
		}
		got = append(got, d)
	}
	if !strings.Contains(strings.Join(got, " "), v3.Digest) {
		t.Fatalf("gc removed %v, not the unreferenced %s", got, v3.Digest)
	}
	if ok, _ := env.Catalog.Store().Stored(ctx, v3.Digest); ok {
		t.Fatal("collected version still in the blob store")
	}
	if _, err := e.InspectTemplate(ctx, v3.Digest); !errdefs.IsNotFound(err) {
		t.Fatalf("collected version inspects: %v", err)
	}
	// Once the old sandbox and its checkpoints are gone, v1 goes too.
	if err := e.Destroy(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	cks, _ := e.ListCheckpoints(ctx, "default", sb.ID, false)
	for _, ck := range cks {
		if err := e.DeleteCheckpoint(ctx, "default", ck.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.RemoveTemplate(ctx, "tpl@"+v1.Digest); err != nil {
		t.Fatalf("rm of an unreferenced version: %v", err)
	}
}

// TestTemplateTagMoveAndWarmPool: after a template's tag moves, a create
// gets the new version even though the warm pool held a sandbox of the old
// one (which is destroyed, not handed out), and a create pinned to the old
// version bypasses the pool.
func TestTemplateTagMoveAndWarmPool(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	v1 := importRelease(t, env.Catalog, "tpl", "v1").Version
	env.SetOptions(func(o *engine.Options) { o.Pool = map[string]int{"tpl": 1} })
	env.Restart(t)
	e := env.Engine
	deadline := time.Now().Add(time.Minute)
	for {
		if _, ready := e.PoolSize("tpl"); ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm pool did not fill")
		}
		time.Sleep(50 * time.Millisecond)
	}
	pooled, _ := env.Meta.List(ctx, meta.Filter{})
	if len(pooled) != 1 || pooled[0].TemplateVersion != v1.Digest {
		t.Fatalf("pool: %+v", pooled)
	}
	v2 := importRelease(t, env.Catalog, "tpl", "v2").Version
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.TemplateVersion != v2.Digest || sb.ID == pooled[0].ID || release(t, e, sb.ID) != "v2" {
		t.Fatalf("create after the tag moved: %s on %s", sb.ID, sb.TemplateVersion)
	}
	if old, _ := env.Meta.Get(ctx, pooled[0].ID); old.State != meta.StateDestroyed {
		t.Fatalf("the stale pooled sandbox is %s", old.State)
	}
	pin, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl@" + v1.Digest})
	if err != nil || pin.FromPool || release(t, e, pin.ID) != "v1" {
		t.Fatalf("pinned create: %+v %v", pin, err)
	}
}

// TestTemplateRestoreOnAFreshNode: a node with only the log, the metadata
// and the blob store — a driver state directory that never saw the
// sandbox, an empty template cache and no setup-script templates at all —
// recovers a sandbox: its template version comes from the blob store.
func TestTemplateRestoreOnAFreshNode(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	v1 := importRelease(t, env.Catalog, "tpl", "v1").Version
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "tpl", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, code := execOut(t, env.Engine, "default", sb.ID, "sh", "-c", "echo kept > /root/state"); code != 0 {
		t.Fatal("write state")
	}
	// A file of 1 MiB or more travels as a blob of the image
	// (layer-blobs/, drivers/internal/layer's blobs.go) through the chunk
	// store.
	bigSum, code := execOut(t, env.Engine, "default", sb.ID, "sh", "-c", "dd if=/dev/urandom of=/root/big bs=1024 count=3000 2>/dev/null && sha256sum /root/big")
	if code != 0 {
		t.Fatal("write the large file")
	}
	if _, err := env.Engine.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID}); err != nil {
		t.Fatal(err)
	}
	// The node dies: its sandbox and its local state are gone.
	if _, err := env.Engine.Kill(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := env.Driver.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	env.Close(t)

	node2 := filepath.Join(env.Dir, "node2")
	os.MkdirAll(node2, 0o711)
	env.Driver = enginetest.NewDriver(t, filepath.Join(node2, "driver"))
	bs, err := localfs.Open(env.Blobs)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: enginetest.TestMasterKey})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := engine.NewCatalog(engine.CatalogOptions{Root: filepath.Join(node2, "templates"), Blobs: bs, Chunks: cs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Get("minimal"); !errdefs.IsNotFound(err) {
		t.Fatalf("node 2 has setup-script templates (%v): the test would prove nothing", err)
	}
	// Node 2's own work directory: no hot copy, the image comes from the
	// chunk store.
	os.MkdirAll(filepath.Join(node2, "work"), 0o700)
	env.SetOptions(func(o *engine.Options) { o.Templates, o.WorkDir = cat, filepath.Join(node2, "work") })
	env.Restart(t)
	got, err := env.Engine.Recover(ctx, "default", sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != meta.StateRunning || release(t, env.Engine, sb.ID) != "v1" {
		t.Fatalf("recovered on node 2: %s, release %q", got.State, release(t, env.Engine, sb.ID))
	}
	if out, _ := execOut(t, env.Engine, "default", sb.ID, "cat", "/root/state"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("state on node 2: %q", out)
	}
	if out, _ := execOut(t, env.Engine, "default", sb.ID, "sha256sum", "/root/big"); out != bigSum {
		t.Fatalf("large file on node 2: %q, was %q", out, bigSum)
	}
	if _, err := os.Stat(filepath.Join(node2, "templates", "versions", strings.TrimPrefix(v1.Digest, "sha256:"), "rootfs", "etc", "amber-release")); err != nil {
		t.Fatalf("node 2 did not cache the fetched version: %v", err)
	}

	// A version gone from everywhere (removed behind the engine's back):
	// the restore is refused, saying so, and nothing runs.
	if err := env.Engine.Destroy(ctx, "default", sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := cat.Store().Remove(ctx, v1.Digest); err != nil {
		t.Fatal(err)
	}
	cks, _ := env.Engine.ListCheckpoints(ctx, "default", sb.ID, false)
	_, err = env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: cks[0].ID, AsNew: true})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "neither this node nor the blob store") {
		t.Fatalf("restore on a version nobody has: %v", err)
	}
	if sbs, _ := env.Engine.List(ctx, "default"); len(sbs) != 0 {
		t.Fatalf("a refused restore left sandboxes: %+v", sbs)
	}
}

// TestCatalogOldVersionStrings: a setup-script template's version string
// from before content addressing (what old sandboxes and checkpoints
// recorded) still names its files, and stays what the images know.
func TestCatalogOldVersionStrings(t *testing.T) {
	cat := enginetest.Catalog(t)
	ctx := context.Background()
	cur, err := cat.Get("minimal")
	if err != nil {
		t.Fatal(err)
	}
	v, err := cat.Store().Version(ctx, cur.Version)
	if err != nil || len(v.Aliases) != 1 {
		t.Fatalf("adopted minimal: %+v %v", v, err)
	}
	old, err := cat.Version(ctx, "minimal", v.Aliases[0])
	if err != nil {
		t.Fatal(err)
	}
	if old.Version != v.Aliases[0] || old.RootFS != cur.RootFS {
		t.Fatalf("by its old version string: %+v, want version %s on %s", old, v.Aliases[0], cur.RootFS)
	}
	if d, err := cat.Digest(ctx, "minimal", v.Aliases[0]); err != nil || d != cur.Version {
		t.Fatalf("digest of the old version string: %s %v, want %s", d, err, cur.Version)
	}
	if _, err := cat.Version(ctx, "minimal", "sha256:0123456789abcdef01234567"); err == nil {
		t.Fatal("an unknown old version string resolved")
	}
}
