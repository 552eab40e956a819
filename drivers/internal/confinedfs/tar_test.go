package confinedfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

type tarEntry struct {
	hdr  *tar.Header
	body string
}

func tarFile(name, body string) tarEntry {
	return tarEntry{&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0)}, body}
}
func tarDir(name string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}}
}
func tarLink(name, target string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func tarHard(name, target string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func tarOf(t testing.TB, ents ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		if err := tw.WriteHeader(e.hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// untar reads an archive into name → entry; a global header's comment is
// under "comment".
func untar(t testing.TB, b []byte) map[string]tarEntry {
	t.Helper()
	out := map[string]tarEntry{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			out["comment"] = tarEntry{h, h.PAXRecords["comment"]}
			continue
		}
		body, _ := io.ReadAll(tr)
		out[h.Name] = tarEntry{h, string(body)}
	}
}

func TestTarRoundTrip(t *testing.T) {
	fx := newFixture(t)
	mustMkdir(t, filepath.Join(fx.root, "src/sub"))
	mustWrite(t, filepath.Join(fx.root, "src/a.txt"), []byte("A"))
	mustWrite(t, filepath.Join(fx.root, "src/sub/b.txt"), []byte("BB"))
	if err := os.Chmod(filepath.Join(fx.root, "src/sub/b.txt"), 0o751); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"src/abs": "/etc", "src/out": fx.outside, "src/rel": "sub/b.txt"} {
		if err := os.Symlink(target, filepath.Join(fx.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := fx.fs.TarOut(bg, "/src", &out); err != nil {
		t.Fatal(err)
	}
	ents := untar(t, out.Bytes())
	want := map[string]byte{"src/": tar.TypeDir, "src/a.txt": tar.TypeReg, "src/sub/": tar.TypeDir, "src/sub/b.txt": tar.TypeReg,
		"src/abs": tar.TypeSymlink, "src/out": tar.TypeSymlink, "src/rel": tar.TypeSymlink}
	if len(ents) != len(want) {
		t.Fatalf("TarOut entries: %v", keys(ents))
	}
	for n, typ := range want {
		if ents[n].hdr == nil || ents[n].hdr.Typeflag != typ {
			t.Fatalf("entry %s: %+v", n, ents[n].hdr)
		}
	}
	if ents["src/abs"].hdr.Linkname != "/etc" || ents["src/sub/b.txt"].body != "BB" || ents["src/sub/b.txt"].hdr.Mode != 0o751 {
		t.Fatalf("entries wrong: %+v %+v", ents["src/abs"].hdr, ents["src/sub/b.txt"].hdr)
	}
	// A single file; a symlink as the path itself is stored, not followed.
	out.Reset()
	if err := fx.fs.TarOut(bg, "/etclink", &out); err != nil {
		t.Fatal(err)
	}
	if e := untar(t, out.Bytes()); len(e) != 1 || e["etclink"].hdr.Typeflag != tar.TypeSymlink {
		t.Fatalf("TarOut of a symlink: %v", keys(e))
	}

	// Back in, elsewhere.
	if err := fx.fs.TarIn(bg, "/dst", bytes.NewReader(out.Bytes())); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := fx.fs.TarOut(bg, "/src", &out); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.TarIn(bg, "/dst", &out); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.root, "dst/src/sub/b.txt")); string(b) != "BB" {
		t.Fatalf("round trip: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(fx.root, "dst/src/out")); l != fx.outside {
		t.Fatalf("symlink round trip: %q", l)
	}
	if st, _ := os.Stat(filepath.Join(fx.root, "dst/src/sub/b.txt")); st.Mode().Perm() != 0o751 {
		t.Fatalf("mode round trip: %v", st.Mode())
	}
	fx.checkOutside(t)
}

func keys(m map[string]tarEntry) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestTarInSlip(t *testing.T) {
	fx := newFixture(t)
	mustMkdir(t, filepath.Join(fx.root, "x/y"))
	for _, name := range []string{
		"../evil", "../../../../../../evil", "/evil", "/etc/passwd", "a/../../evil", "./../evil",
		"x/../../evil",
	} {
		err := fx.fs.TarIn(bg, "/x/y", bytes.NewReader(tarOf(t, tarFile(name, "evil"))))
		fx.checkErr(t, err)
		wantKind(t, err, errdefs.ErrInvalidArgument, "entry "+name)
	}
	// Hard link and symlink names are entries too.
	err := fx.fs.TarIn(bg, "/x/y", bytes.NewReader(tarOf(t, tarLink("../evil", "/etc"))))
	wantKind(t, err, errdefs.ErrInvalidArgument, "symlink entry climbing out")
	if b, _ := os.ReadFile(filepath.Join(fx.root, "etc/passwd")); string(b) != "sandbox passwd\n" {
		t.Fatalf("root's passwd changed: %q", b)
	}
	for _, p := range []string{"evil", "x/evil", "x/y/evil"} {
		if _, err := os.Lstat(filepath.Join(fx.root, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s created", p)
		}
	}
	fx.checkOutside(t)
}

// TestTarInSymlinkThenWrite: an archive that plants a symlink and then
// writes through it must not write outside the target directory — not to
// the host, and not elsewhere in the sandbox either.
func TestTarInSymlinkThenWrite(t *testing.T) {
	fx := newFixture(t)
	for _, c := range []struct {
		name string
		ents []tarEntry
	}{
		{"absolute to /etc", []tarEntry{tarLink("l", "/etc"), tarFile("l/passwd", "pwned")}},
		{"absolute to the host dir", []tarEntry{tarLink("l", fx.outside), tarFile("l/marker", "pwned")}},
		{"relative climbing", []tarEntry{tarLink("l", "../../.."), tarFile("l/etc/passwd", "pwned")}},
		{"nested", []tarEntry{tarDir("a"), tarLink("a/l", "../../etc"), tarFile("a/l/passwd", "pwned")}},
		{"dir entry through link", []tarEntry{tarLink("l", "/etc"), tarDir("l/newdir")}},
		{"hard link through link", []tarEntry{tarLink("l", "/etc"), tarHard("h", "l/passwd")}},
		{"symlink entry through link", []tarEntry{tarLink("l", "/etc"), tarLink("l/passwd", "/x")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := fx.fs.TarIn(bg, "/home/user/dst", bytes.NewReader(tarOf(t, c.ents...)))
			fx.checkErr(t, err)
			wantKind(t, err, errdefs.ErrPermissionDenied, c.name)
			if b, _ := os.ReadFile(filepath.Join(fx.root, "etc/passwd")); string(b) != "sandbox passwd\n" {
				t.Fatalf("root's /etc/passwd changed: %q", b)
			}
			if _, err := os.Lstat(filepath.Join(fx.root, "etc/newdir")); err == nil {
				t.Fatal("created /etc/newdir")
			}
			fx.checkOutside(t)
			_ = os.RemoveAll(filepath.Join(fx.root, "home/user/dst"))
		})
	}
	// A pre-existing symlink in the target directory is no way out either.
	mustMkdir(t, filepath.Join(fx.root, "home/user/dst"))
	if err := os.Symlink("/etc", filepath.Join(fx.root, "home/user/dst/pre")); err != nil {
		t.Fatal(err)
	}
	err := fx.fs.TarIn(bg, "/home/user/dst", bytes.NewReader(tarOf(t, tarFile("pre/passwd", "pwned"))))
	wantKind(t, err, errdefs.ErrPermissionDenied, "pre-existing link")
	// An entry at the link's own name replaces the link.
	if err := fx.fs.TarIn(bg, "/home/user/dst", bytes.NewReader(tarOf(t, tarFile("pre", "file now")))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.root, "home/user/dst/pre")); string(b) != "file now" {
		t.Fatalf("pre = %q", b)
	}
	// Symlinks that stay inside the target directory work.
	if err := fx.fs.TarIn(bg, "/home/user/dst", bytes.NewReader(tarOf(t,
		tarDir("real"), tarLink("in", "real"), tarFile("in/f", "through"), tarLink("up", "real/../real"), tarFile("up/g", "g")))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.root, "home/user/dst/real/f")); string(b) != "through" {
		t.Fatalf("in-directory symlink: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.root, "etc/passwd")); string(b) != "sandbox passwd\n" {
		t.Fatalf("root's /etc/passwd changed: %q", b)
	}
	fx.checkOutside(t)
}

func TestTarInHardLinks(t *testing.T) {
	fx := newFixture(t)
	if err := fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, tarFile("a", "data"), tarDir("s"), tarHard("s/b", "a")))); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(fx.root, "d/a"))
	b, _ := os.Stat(filepath.Join(fx.root, "d/s/b"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Fatal("hard link not created")
	}
	for _, target := range []string{"../etc/passwd", "/etc/passwd", fx.outside + "/marker", "../../outside/marker", ""} {
		err := fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, tarHard("h", target))))
		wantKind(t, err, errdefs.ErrInvalidArgument, "hard link to "+target)
	}
	if _, err := os.Lstat(filepath.Join(fx.root, "d/h")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("bad hard link created")
	}
	fx.checkOutside(t)
}

func TestTarInRefusesDevices(t *testing.T) {
	fx := newFixture(t)
	dev := tarEntry{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "sda", Devmajor: 8, Devminor: 0, Mode: 0o666}}
	err := fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, dev)))
	wantKind(t, err, errdefs.ErrPermissionDenied, "char device")
	blk := tarEntry{hdr: &tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Devminor: 0, Mode: 0o666}}
	err = fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, blk)))
	wantKind(t, err, errdefs.ErrPermissionDenied, "block device")
	fifo := tarEntry{hdr: &tar.Header{Typeflag: tar.TypeFifo, Name: "p", Mode: 0o666}}
	err = fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, fifo)))
	wantKind(t, err, errdefs.ErrInvalidArgument, "fifo")
	if ents, _ := os.ReadDir(filepath.Join(fx.root, "d")); len(ents) != 0 {
		t.Fatalf("created %v", ents)
	}
	// Set-ID bits are dropped.
	suid := tarFile("s", "x")
	suid.hdr.Mode = 0o4755
	if err := fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, suid))); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(fx.root, "d/s")); st.Mode()&os.ModeSetuid != 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", st.Mode())
	}
	if err := fx.fs.TarIn(bg, "/d", strings.NewReader("this is not a tar archive, not even close; it goes on for a while to fill a block")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("garbage: %v", err)
	}
}

// TestTarInBomb: 256 MiB of zeros, gzip-compressed to a few hundred KiB,
// against a 16 MiB limit: refused before the big entry is written, quickly.
func TestTarInBomb(t *testing.T) {
	fx := newFixture(t, WithTarLimits(16<<20, 100))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	tw := tar.NewWriter(zw)
	for i, size := range []int64{1 << 20, 256 << 20} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: string(rune('a' + i)), Mode: 0o644, Size: size}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(tw, zeros{}, size); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	t.Logf("bomb: %d bytes compressed", gz.Len())
	start := time.Now()
	zr, err := gzip.NewReader(&gz)
	if err != nil {
		t.Fatal(err)
	}
	err = fx.fs.TarIn(bg, "/d", zr)
	wantKind(t, err, errdefs.ErrResourceExhausted, "bomb")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("bomb took %v", d)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "d/b")); !errors.Is(err, os.ErrNotExist) {
		t.Error("bomb entry written")
	}
	// Entry-count bomb.
	var ents []tarEntry
	for i := range 101 {
		ents = append(ents, tarFile("f"+string(rune('A'+i%26))+string(rune('a'+i/26)), ""))
	}
	err = fx.fs.TarIn(bg, "/e", bytes.NewReader(tarOf(t, ents...)))
	wantKind(t, err, errdefs.ErrResourceExhausted, "entry bomb")
}
