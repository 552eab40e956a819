package templatestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/stores/localfs"
	"github.com/amber-run/amber/stores/s3"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

var testKey = []byte("amber-templatestore-test-key-32b")

// tree makes a small root filesystem with every kind of entry.
func tree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "var/lib/dpkg"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "bin/busybox"), []byte("#!not really\n"), 0o755))
	must(os.Symlink("busybox", filepath.Join(dir, "bin/sh")))
	must(os.WriteFile(filepath.Join(dir, "etc/release"), []byte("v1\n"), 0o644))
	must(os.Link(filepath.Join(dir, "etc/release"), filepath.Join(dir, "etc/release.hard")))
	must(os.WriteFile(filepath.Join(dir, "bin/su"), []byte("su"), 0o755))
	must(os.Chmod(filepath.Join(dir, "bin/su"), os.ModeSetuid|0o755))
	must(os.Lchown(filepath.Join(dir, "etc/release"), 1000, 1001))
	must(unix.Mkfifo(filepath.Join(dir, "etc/fifo"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "var/lib/dpkg/status"), []byte(
		"Package: libc6\nStatus: install ok installed\nMulti-Arch: same\nArchitecture: amd64\nVersion: 2.36-9+deb12u9\n\n"+
			"Package: python3\nStatus: install ok installed\nVersion: 3.11.2-1+b1\n\n"+
			"Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n"), 0o644))
	_ = unix.Lsetxattr(filepath.Join(dir, "bin/busybox"), "user.amber", []byte("x"), 0) // where the fs allows
}

func digest(t *testing.T, dir string) string {
	t.Helper()
	tr, err := TreeDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Digest
}

// TestCanonicalDigest: a copy through the canonical stream digests the
// same; every kind of change digests differently.
func TestCanonicalDigest(t *testing.T) {
	a := filepath.Join(t.TempDir(), "a")
	tree(t, a)
	d0 := digest(t, a)
	if d0 != digest(t, a) {
		t.Fatal("two digests of one tree differ")
	}
	b := filepath.Join(t.TempDir(), "b")
	os.Mkdir(b, 0o755)
	var buf bytes.Buffer
	if _, err := WriteCanonical(a, &buf); err != nil {
		t.Fatal(err)
	}
	if err := Extract(bytes.NewReader(buf.Bytes()), b); err != nil {
		t.Fatal(err)
	}
	if got := digest(t, b); got != d0 {
		t.Fatalf("extracted copy digests to %s, original %s", got, d0)
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(b, "etc/release.hard"), &st)
	if st.Nlink != 2 || st.Uid != 1000 || st.Gid != 1001 {
		t.Fatalf("hard link or owner not kept: nlink %d uid %d gid %d", st.Nlink, st.Uid, st.Gid)
	}
	if fi, _ := os.Stat(filepath.Join(b, "bin/su")); fi.Mode()&os.ModeSetuid == 0 {
		t.Fatal("setuid bit lost")
	}
	changes := map[string]func(dir string) error{
		"content": func(d string) error { return os.WriteFile(filepath.Join(d, "etc/release"), []byte("v2\n"), 0o644) },
		"mode":    func(d string) error { return os.Chmod(filepath.Join(d, "bin/busybox"), 0o700) },
		"owner":   func(d string) error { return os.Lchown(filepath.Join(d, "bin/busybox"), 5, 5) },
		"symlink": func(d string) error {
			os.Remove(filepath.Join(d, "bin/sh"))
			return os.Symlink("/bin/busybox", filepath.Join(d, "bin/sh"))
		},
		"new file":  func(d string) error { return os.WriteFile(filepath.Join(d, "etc/new"), nil, 0o644) },
		"dir mode":  func(d string) error { return os.Chmod(filepath.Join(d, "etc"), 0o700) },
		"hard link": func(d string) error { return os.Remove(filepath.Join(d, "etc/release.hard")) },
	}
	for what, change := range changes {
		c := filepath.Join(t.TempDir(), "c")
		os.Mkdir(c, 0o755)
		if err := Extract(bytes.NewReader(buf.Bytes()), c); err != nil {
			t.Fatal(err)
		}
		if err := change(c); err != nil {
			t.Fatal(err)
		}
		if digest(t, c) == d0 {
			t.Errorf("a change of %s does not change the digest", what)
		}
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	for _, name := range []string{"../x", "/etc/x", "a/b"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644})
		tw.Close()
		err := Extract(&buf, t.TempDir())
		if !errdefs.IsDataLoss(err) {
			t.Errorf("entry %q: %v, want data loss", name, err)
		}
	}
}

type env struct {
	blobs  string
	chunks *chunkstore.Store
	fail   func(string) error
}

func newEnv(t *testing.T) *env {
	e := &env{blobs: t.TempDir()}
	bs, err := localfs.Open(e.blobs)
	if err != nil {
		t.Fatal(err)
	}
	e.chunks, err = chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: testKey, FailAt: func(s string) error {
		if e.fail != nil {
			return e.fail(s)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// node opens a store with its own (empty) local cache over e's blob store.
func (e *env) node(t *testing.T) *Store {
	bs, _ := localfs.Open(e.blobs)
	s, err := Open(Config{Root: t.TempDir(), Blobs: bs, Chunks: e.chunks})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tarOf(t *testing.T, dir string) []byte {
	var buf bytes.Buffer
	if _, err := WriteCanonical(dir, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportVersionsTagsAndFetch: identical content is one version; a
// change is a new version and moves the tag while the old one stays
// resolvable; a node with an empty cache fetches a version (or a tag)
// from the blob store, byte-identical.
func TestImportVersionsTagsAndFetch(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	s := e.node(t)
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	defs := Defaults{Env: []string{"A=1"}, Cwd: "/root"}
	r1, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), defs)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Existed || r1.Version.Packages["python3"] != "3.11.2-1+b1" || r1.Version.Packages["libc6:amd64"] != "2.36-9+deb12u9" || len(r1.Version.Packages) != 2 {
		t.Fatalf("first import: %+v", r1)
	}
	r2, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), defs)
	if err != nil || !r2.Existed || r2.Version.Digest != r1.Version.Digest {
		t.Fatalf("re-import of the same content: %+v %v", r2, err)
	}
	if vs, _ := s.Local(); len(vs) != 1 {
		t.Fatalf("%d local versions after two identical imports", len(vs))
	}
	// Other defaults are other content.
	if r, err := s.Import(ctx, "other", bytes.NewReader(tarOf(t, src)), Defaults{Cwd: "/"}); err != nil || r.Version.Digest == r1.Version.Digest {
		t.Fatalf("other defaults gave %v %v", r.Version.Digest, err)
	}
	os.WriteFile(filepath.Join(src, "etc/release"), []byte("v2\n"), 0o644)
	r3, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), defs)
	if err != nil || r3.Existed || r3.Version.Digest == r1.Version.Digest || r3.Previous != r1.Version.Digest {
		t.Fatalf("import of changed content: %+v %v", r3, err)
	}
	if v, err := s.Resolve(ctx, "tpl"); err != nil || v.Digest != r3.Version.Digest {
		t.Fatalf("tag tpl → %s %v, want the new version", v.Digest, err)
	}
	old, err := s.Resolve(ctx, "tpl@"+r1.Version.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(old.Path, "etc/release")); string(b) != "v1\n" {
		t.Fatalf("old version reads %q", b)
	}

	// Evicted here: fetched back from the blob store.
	if err := s.Evict(r1.Version.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old.Path); !os.IsNotExist(err) {
		t.Fatalf("evicted rootfs still there: %v", err)
	}
	back, err := s.Version(ctx, r1.Version.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if back.RootFS.Digest != r1.Version.RootFS.Digest || digest(t, back.Path) != r1.Version.RootFS.Digest {
		t.Fatalf("fetched version differs: %+v", back)
	}
	// Another node with nothing cached: by digest and by the blob tag.
	n2 := e.node(t)
	if v, err := n2.Resolve(ctx, "tpl"); err != nil || v.Digest != r3.Version.Digest || digest(t, v.Path) != r3.Version.RootFS.Digest {
		t.Fatalf("node 2 tpl: %+v %v", v, err)
	}
	if v, err := n2.Version(ctx, r1.Version.Digest); err != nil || v.Digest != r1.Version.Digest {
		t.Fatalf("node 2 old version: %v", err)
	}

	// Removed everywhere: nobody can fetch it any more.
	if err := s.Remove(ctx, r1.Version.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := e.node(t).Version(ctx, r1.Version.Digest); !errdefs.IsNotFound(err) {
		t.Fatalf("removed version: %v, want not found", err)
	}
}

// TestTagMovesOnlyAfterTheVersionIsStored: a push that fails before its
// pointer leaves the tag where it was, here and in the blob store.
func TestTagMovesOnlyAfterTheVersionIsStored(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	s := e.node(t)
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	r1, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "etc/release"), []byte("v2\n"), 0o644)
	for _, step := range []string{"chunks", "manifest", "publish"} {
		e.fail = func(s string) error {
			if s == step {
				return errors.New("injected crash at " + s)
			}
			return nil
		}
		if _, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{}); err == nil {
			t.Fatalf("crash at %s: import succeeded", step)
		}
		e.fail = nil
		if tags, _ := s.Tags(); tags["tpl"] != r1.Version.Digest {
			t.Fatalf("crash at %s: local tag moved to %s", step, tags["tpl"])
		}
		if v, err := e.node(t).Resolve(ctx, "tpl"); err != nil || v.Digest != r1.Version.Digest {
			t.Fatalf("crash at %s: blob tag → %s %v", step, v.Digest, err)
		}
	}
	if r, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{}); err != nil || r.Version.Digest == r1.Version.Digest {
		t.Fatalf("import after the crashes: %v", err)
	}
}

// TestPushRefusesAChangedLocalCopy: a cached rootfs edited in place is not
// stored under its old digest.
func TestPushRefusesAChangedLocalCopy(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	r, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.Version.Path, "etc/release"), []byte("tampered\n"), 0o644)
	e := newEnv(t)
	bs, _ := localfs.Open(e.blobs)
	s.cfg.Blobs, s.cfg.Chunks = bs, e.chunks
	if err := s.Push(ctx, r.Version.Digest); !errdefs.IsDataLoss(err) {
		t.Fatalf("push of a tampered copy: %v, want data loss", err)
	}
	if ok, _ := s.Stored(ctx, r.Version.Digest); ok {
		t.Fatal("tampered copy stored")
	}
}

// TestAdoptSetupScriptTemplate: a setup-script directory becomes a
// version once, with its template.json defaults and its old version
// string as an alias.
func TestAdoptSetupScriptTemplate(t *testing.T) {
	ctx := context.Background()
	legacy := t.TempDir()
	dir := filepath.Join(legacy, "py-bookworm-abc")
	tree(t, filepath.Join(dir, "rootfs"))
	os.WriteFile(filepath.Join(dir, "template.json"), []byte(`{"cwd":"/work","limits":{"pids":77}}`), 0o644)
	root := t.TempDir()
	s, err := Open(Config{Root: root, LegacyDir: legacy, LegacyDefaults: map[string]Defaults{"py": {User: "0:0"}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Resolve(ctx, "py")
	if err != nil {
		t.Fatal(err)
	}
	if v.Path != filepath.Join(dir, "rootfs") || v.Defaults.Cwd != "/work" || v.Defaults.User != "0:0" || v.Defaults.Limits.Pids != 77 || len(v.Aliases) != 1 {
		t.Fatalf("adopted: %+v", v)
	}
	if a, err := s.Version(ctx, v.Aliases[0]); err != nil || a.Digest != v.Digest {
		t.Fatalf("by alias: %v %v", a.Digest, err)
	}
	// A second store over the same root does not digest it again.
	s2, _ := Open(Config{Root: root, LegacyDir: legacy})
	os.Remove(filepath.Join(root, "tags", "py.json"))
	v2, err := s2.Resolve(ctx, "py")
	if err != nil || v2.Digest != v.Digest {
		t.Fatalf("second adoption: %v %v", v2.Digest, err)
	}
	for _, ref := range []string{"nope", "no-such-template", "Bad"} {
		if _, err := s.Resolve(ctx, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("unknown name %q: %v", ref, err)
		}
	}
	if _, err := s.Resolve(ctx, "py@sha256:zz"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed digest: %v", err)
	}
}

// TestCollectChunksRemovesAFailedPushsChunks: chunks a push wrote before
// failing are unreferenced; CollectChunks removes them and keeps the
// stored versions whole.
func TestCollectChunksRemovesAFailedPushsChunks(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	s := e.node(t)
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	r1, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	chunks := func() int {
		n := 0
		for _, dir := range []string{"chunks", "packs"} {
			filepath.WalkDir(filepath.Join(e.blobs, "objects", "tenants", SystemTenant, dir), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					n++
				}
				return nil
			})
		}
		return n
	}
	before := chunks()
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i*7 + i/4096)
	}
	os.WriteFile(filepath.Join(src, "etc/big"), big, 0o644)
	e.fail = func(step string) error {
		if step == "manifest" {
			return errors.New("injected crash before the manifest")
		}
		return nil
	}
	if _, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{}); err == nil {
		t.Fatal("import with a failing push succeeded")
	}
	e.fail = nil
	orphaned := chunks()
	if orphaned <= before {
		t.Fatalf("the failed push wrote no chunks (%d, before %d): the test proves nothing", orphaned, before)
	}
	if err := s.CollectChunks(ctx); err != nil {
		t.Fatal(err)
	}
	if got := chunks(); got != before {
		t.Fatalf("%d chunks after collection, want %d (the stored version's)", got, before)
	}
	s.Evict(r1.Version.Digest)
	if _, err := s.Version(ctx, r1.Version.Digest); err != nil {
		t.Fatalf("stored version after collection: %v", err)
	}
}

// TestPackagesMatchDpkgQuery: the package versions read from a rootfs's
// dpkg database are what `dpkg-query -W` printed for it when the setup
// script built it (packages.txt).
func TestPackagesMatchDpkgQuery(t *testing.T) {
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	dirs, _ := filepath.Glob(filepath.Join(cache, "templates", "python-*"))
	if len(dirs) == 0 {
		t.Skip("no python template (make setup)")
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], "packages.txt"))
	if err != nil {
		t.Skip("no packages.txt")
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, _ := strings.Cut(line, "\t")
		want[k] = v
	}
	got, err := dpkgPackages(filepath.Join(dirs[0], "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(got) < 10 {
		t.Fatalf("%d packages read, packages.txt has %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("package %s: read %q, dpkg-query said %q", k, got[k], v)
		}
	}
}

// TestVersionsOnMinIO: two nodes share only a MinIO bucket; a version
// imported on one is fetched, verified and usable on the other, by digest
// and by its tag.
func TestVersionsOnMinIO(t *testing.T) {
	ctx := context.Background()
	srv := miniotest.Start(t)
	cfg := srv.Config() // one bucket, both nodes
	node := func() *Store {
		bs, err := s3.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := chunkstore.New(chunkstore.Config{Blobs: bs, MasterKey: testKey})
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(Config{Root: t.TempDir(), Blobs: bs, Chunks: cs})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	r, err := node().Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	other := node()
	v, err := other.Resolve(ctx, "tpl")
	if err != nil {
		t.Fatal(err)
	}
	if v.Digest != r.Version.Digest || digest(t, v.Path) != r.Version.RootFS.Digest {
		t.Fatalf("node 2 got %+v", v)
	}
	if b, _ := os.ReadFile(filepath.Join(v.Path, "etc/release")); string(b) != "v1\n" {
		t.Fatalf("node 2 reads %q", b)
	}
}

// A new version of a template is pushed with the previous one as its
// parent, so the chunks they share are not stored twice (the chunk store
// deduplicates against a parent's manifest only).
func TestNewVersionPushSharesChunks(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	s := e.node(t)
	src := filepath.Join(t.TempDir(), "rootfs")
	tree(t, src)
	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i*7 + i/4096 + i/999)
	}
	if err := os.WriteFile(filepath.Join(src, "etc/big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	stored := func() int64 {
		var n int64
		filepath.WalkDir(filepath.Join(e.blobs, "objects", "tenants", SystemTenant), func(p string, d os.DirEntry, err error) error {
			if info, ierr := d.Info(); err == nil && ierr == nil && !d.IsDir() {
				n += info.Size()
			}
			return nil
		})
		return n
	}
	if _, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{}); err != nil {
		t.Fatal(err)
	}
	first := stored()
	if err := os.WriteFile(filepath.Join(src, "etc/small"), []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // a later Created
	if _, err := s.Import(ctx, "tpl", bytes.NewReader(tarOf(t, src)), Defaults{}); err != nil {
		t.Fatal(err)
	}
	if grew := stored() - first; grew > first/4 {
		t.Fatalf("the second version stored %d bytes more (the first %d): its chunks were not shared", grew, first)
	}
}
