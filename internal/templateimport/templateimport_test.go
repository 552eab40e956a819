package templateimport

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

func tarball(t *testing.T, files map[string]string, links map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Uid: 1000, Gid: 1000, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	for name, target := range links {
		if err := tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Typeflag: tar.TypeSymlink}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestImportIsContentAddressedAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	tb := tarball(t, map[string]string{"bin/busybox": "not really", "etc/hostname": "imported\n"}, map[string]string{"bin/sh": "busybox"})
	r1, err := Import(context.Background(), dir, "mine", bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Existed || !strings.HasPrefix(filepath.Base(r1.Dir), "mine-imported-") {
		t.Fatalf("first import: %+v", r1)
	}
	b, err := os.ReadFile(filepath.Join(r1.Dir, "rootfs/etc/hostname"))
	if err != nil || string(b) != "imported\n" {
		t.Fatalf("hostname: %q %v", b, err)
	}
	st, err := os.Stat(filepath.Join(r1.Dir, "rootfs/bin/busybox"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("mode not kept: %v %v", st, err)
	}
	r2, err := Import(context.Background(), dir, "mine", bytes.NewReader(tb))
	if err != nil || !r2.Existed || r2.Dir != r1.Dir || r2.Digest != r1.Digest {
		t.Fatalf("second import of the same content: %+v %v (first %+v)", r2, err, r1)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("want exactly one template dir (build dirs removed), have %d", len(ents))
	}
}

func TestImportRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, err := Import(ctx, dir, "Bad-Name", bytes.NewReader([]byte("x"))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := Import(ctx, dir, "empty", bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty tarball: %v", err)
	}
	if _, err := Import(ctx, dir, "garbage", strings.NewReader("this is not a tar archive at all")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("garbage: %v", err)
	}
	if _, err := Import(ctx, dir, "noshell", bytes.NewReader(tarball(t, map[string]string{"etc/x": "y"}, nil))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no /bin/sh: %v", err)
	}
	// A member that climbs out with ".." must not land outside the rootfs.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "bin/sh", Mode: 0o755, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Name: "../escaped", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	r, err := Import(ctx, dir, "climb", &buf)
	if err == nil {
		if _, serr := os.Stat(filepath.Join(r.Dir, "escaped")); serr == nil {
			t.Fatal("a member escaped the rootfs into the template directory")
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "escaped")); err == nil {
		t.Fatal("a member escaped into the catalog directory")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".import-") {
			t.Errorf("a failed import left %s behind", e.Name())
		}
	}
}
