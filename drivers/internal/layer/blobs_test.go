package layer

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"

	"github.com/amber-run/amber/lib/failpoint"
)

// addBigFiles puts large files into the upper dir: big/a (with an xattr,
// a hard link big/hl and an owner of the sandbox's range) and big/b, and
// sets every time of the tree again.
func addBigFiles(t testing.TB, dir string, ids IDMap) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, "big"), 0o750); err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]int{"big/a": 2 << 20, "big/b": 3<<20 + 17} {
		b := make([]byte, size)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(dir, "big/a"), filepath.Join(dir, "big/hl")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(dir, "big/a"), "user.tag", []byte("large"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "big/b"), 0o4750); err != nil {
		t.Fatal(err)
	}
	u := 1000
	if ids.Size > 0 {
		u += ids.Host
	}
	if err := os.Lchown(filepath.Join(dir, "big/a"), u, u+1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"big", "big/b"} {
		if err := os.Lchown(filepath.Join(dir, p), u-1000, u-1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "big/b"), 0o4750); err != nil { // after chown, which clears it
		t.Fatal(err)
	}
	for _, p := range []string{"big/a", "big/b", "big", "."} {
		setTestTimes(t, filepath.Join(dir, p))
	}
}

// blobsOf returns the image's blob references by entry name (key) and the
// archive's headers.
func blobsOf(t testing.TB, ar string) map[string]string {
	t.Helper()
	refs := map[string]string{}
	for _, h := range readArchive(t, ar) {
		if k, ok := h.PAXRecords[paxBlob]; ok {
			if h.Size != 0 || h.Typeflag != tar.TypeReg {
				t.Fatalf("%s: a reference of type %q with %d bytes", h.Name, h.Typeflag, h.Size)
			}
			refs[h.Name] = k
		}
	}
	return refs
}

func inode(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func cacheNames(t testing.TB, cache string) []string {
	t.Helper()
	ents, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

// TestArchiveBlobs: with a blob cache, large files are referenced, not
// copied: the archive stays small, the image's blob is a hard link to the
// cache file, a second cut of the unchanged tree links the same inode, and
// the extraction gives back every entry as it was (content, modes with
// set-ID bits, owners, times, xattrs, the hard link) in files of their own
// inodes. A file changed in its change time only (same size and
// modification time) or in its size is copied again under a new key, and
// the cache keeps only what the last cut references.
func TestArchiveBlobs(t *testing.T) {
	for _, m := range archiveIDMaps {
		t.Run(m.name, func(t *testing.T) {
			src, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
			makeUpper(t, src, m.ids)
			addBigFiles(t, src, m.ids)
			want := snapshot(t, src, true)
			cut := func() (string, map[string]string) {
				t.Helper()
				ar := filepath.Join(t.TempDir(), "layer.tar")
				n, size, err := WriteArchiveFile(ar, src, ArchiveOptions{IDs: m.ids, BlobCache: cache})
				if err != nil {
					t.Fatal(err)
				}
				if n != len(want) {
					t.Fatalf("%d entries, the tree has %d", n, len(want))
				}
				if size > 1<<20 {
					t.Fatalf("layer.tar is %d bytes: the large files were copied into it", size)
				}
				return ar, blobsOf(t, ar)
			}
			extract := func(ar string) {
				t.Helper()
				dst := t.TempDir()
				if _, err := ExtractArchiveFile(ar, dst, ArchiveOptions{IDs: m.ids}); err != nil {
					t.Fatal(err)
				}
				w := want
				if m.ids.Size > 0 {
					e := w["home/user/empty"]
					e.UID, e.GID = uint32(m.ids.Host+Nobody), uint32(m.ids.Host+Nobody)
					w["home/user/empty"] = e
				}
				diffTrees(t, w, snapshot(t, dst, true))
				for name, k := range blobsOf(t, ar) {
					if inode(t, filepath.Join(dst, name)) == inode(t, filepath.Join(filepath.Dir(ar), BlobDirName, k)) {
						t.Errorf("%s was extracted as the blob's own inode", name)
					}
				}
			}
			ar1, refs1 := cut()
			if len(refs1) != 2 || refs1["big/a"] == "" || refs1["big/b"] == "" {
				t.Fatalf("references %v, want big/a and big/b", refs1)
			}
			for name, k := range refs1 {
				if inode(t, filepath.Join(filepath.Dir(ar1), BlobDirName, k)) != inode(t, filepath.Join(cache, k)) {
					t.Errorf("%s: the image's blob is not the cache file", name)
				}
			}
			extract(ar1)

			ar2, refs2 := cut()
			for name, k := range refs1 {
				if refs2[name] != k {
					t.Errorf("%s: second cut references %s, the first %s", name, refs2[name], k)
				}
				if inode(t, filepath.Join(filepath.Dir(ar2), BlobDirName, k)) != inode(t, filepath.Join(filepath.Dir(ar1), BlobDirName, k)) {
					t.Errorf("%s: the second cut's blob is a new file", name)
				}
			}
			extract(ar2)

			// big/b rewritten in place, its size and modification time
			// kept: only its change time tells; big/a grows.
			b, _ := os.ReadFile(filepath.Join(src, "big/b"))
			b[0] ^= 0xff
			if err := os.WriteFile(filepath.Join(src, "big/b"), b, 0); err != nil {
				t.Fatal(err)
			}
			setTestTimes(t, filepath.Join(src, "big/b"))
			f, err := os.OpenFile(filepath.Join(src, "big/a"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("more")
			f.Close()
			setTestTimes(t, filepath.Join(src, "big/a"))
			for _, p := range []string{"big", "."} {
				setTestTimes(t, filepath.Join(src, p))
			}
			want = snapshot(t, src, true)
			ar3, refs3 := cut()
			for name := range refs1 {
				if refs3[name] == refs2[name] {
					t.Errorf("%s changed, and the third cut references its old blob", name)
				}
			}
			extract(ar3)
			// The second image keeps its bytes; the cache only the new.
			if got := cacheNames(t, cache); len(got) != 3 || !strings.Contains(strings.Join(got, " "), refs3["big/a"]) || !strings.Contains(strings.Join(got, " "), refs3["big/b"]) {
				t.Errorf("cache holds %v, want index.json and %v", got, refs3)
			}
			if fi, err := os.Stat(filepath.Join(filepath.Dir(ar2), BlobDirName, refs2["big/b"])); err != nil || fi.Size() != int64(len(b)) {
				t.Errorf("the second image's blob: %v %v", fi, err)
			}

			// Large files gone: the next cut's cache holds the index only.
			if err := os.RemoveAll(filepath.Join(src, "big")); err != nil {
				t.Fatal(err)
			}
			if _, _, err := WriteArchiveFile(filepath.Join(t.TempDir(), "layer.tar"), src, ArchiveOptions{IDs: m.ids, BlobCache: cache}); err != nil {
				t.Fatal(err)
			}
			if got := cacheNames(t, cache); len(got) != 1 || got[0] != blobIndexName {
				t.Errorf("cache holds %v after a cut with no large file", got)
			}
		})
	}
}

// TestArchiveBlobsFailedCut: a cut that fails after copying a new large
// file into the cache removes that copy and keeps the cache's index, so
// the next cut still reuses the files it held.
func TestArchiveBlobsFailedCut(t *testing.T) {
	src, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
	addBigFiles(t, src, IDMap{})
	ar1 := filepath.Join(t.TempDir(), "layer.tar")
	if _, _, err := WriteArchiveFile(ar1, src, ArchiveOptions{BlobCache: cache}); err != nil {
		t.Fatal(err)
	}
	refs1 := blobsOf(t, ar1)
	big := make([]byte, 2<<20)
	if err := os.WriteFile(filepath.Join(src, "big/new"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "zz"), 0o755); err != nil {
		t.Fatal(err)
	}
	fps := failpoint.New()
	boom := errors.New("boom")
	fps.ArmEach(FPArchiveListed, 1, func(subject string) error {
		if subject == "zz" {
			return boom
		}
		return nil
	})
	if _, _, err := WriteArchiveFile(filepath.Join(t.TempDir(), "layer.tar"), src, ArchiveOptions{BlobCache: cache, Failpoints: fps}); !errors.Is(err, boom) {
		t.Fatalf("failed cut: %v", err)
	}
	if got := cacheNames(t, cache); len(got) != 3 {
		t.Errorf("cache holds %v after the failed cut, want index.json and the first cut's two", got)
	}
	ar3 := filepath.Join(t.TempDir(), "layer.tar")
	if _, _, err := WriteArchiveFile(ar3, src, ArchiveOptions{BlobCache: cache}); err != nil {
		t.Fatal(err)
	}
	refs3 := blobsOf(t, ar3)
	if refs3["big/a"] != refs1["big/a"] || refs3["big/b"] != refs1["big/b"] || refs3["big/new"] == "" {
		t.Errorf("after the failed cut: %v, before %v", refs3, refs1)
	}

	// A cut aborted after the archive (the runtime's dump failed) leaves
	// the cache as it was; the next one reuses all three and copies the
	// changed file only.
	if err := os.WriteFile(filepath.Join(src, "big/new"), big[1:], 0o644); err != nil {
		t.Fatal(err)
	}
	before := cacheNames(t, cache)
	c, err := CutArchiveFile(filepath.Join(t.TempDir(), "layer.tar"), src, ArchiveOptions{BlobCache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if c.Reused != 2 || c.Copied != 1 {
		t.Errorf("cut: %d blobs reused, %d copied; want 2 and 1", c.Reused, c.Copied)
	}
	c.Abort()
	if got := cacheNames(t, cache); strings.Join(got, " ") != strings.Join(before, " ") {
		t.Errorf("cache after an aborted cut: %v, before %v", got, before)
	}
	c, err = CutArchiveFile(filepath.Join(t.TempDir(), "layer.tar"), src, ArchiveOptions{BlobCache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	c.Abort() // after Commit: nothing
	if c.Reused != 2 || c.Copied != 1 || len(cacheNames(t, cache)) != 4 {
		t.Errorf("cut after the abort: %d reused, %d copied, cache %v", c.Reused, c.Copied, cacheNames(t, cache))
	}
}

// refTar is an archive of the root and one file f referencing blob key.
func refTar(t testing.TB, recs map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, Format: tar.FormatPAX},
		{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Format: tar.FormatPAX, PAXRecords: recs},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestExtractBlobRefused: a blob that is not what the archive records —
// short, long, of other bytes, missing, a symlink, a FIFO, in a blob
// directory that is a symlink — and a key naming a path outside the blob
// directory are refused as ErrDataLoss with a message that says so,
// without opening a FIFO or touching the host.
func TestExtractBlobRefused(t *testing.T) {
	src, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
	big := make([]byte, 2<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "f"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	if _, _, err := WriteArchiveFile(filepath.Join(img, "layer.tar"), src, ArchiveOptions{BlobCache: cache}); err != nil {
		t.Fatal(err)
	}
	key := blobsOf(t, filepath.Join(img, "layer.tar"))["f"]
	good := readArchive(t, filepath.Join(img, "layer.tar"))[1].PAXRecords
	host, unchanged := hostDir(t)
	hostCopy := filepath.Join(filepath.Dir(host), "blob-copy")
	if err := os.WriteFile(hostCopy, big, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		tamper     func(blob string)
		recs       map[string]string
	}{
		{name: "short", want: "is 2097151 bytes", tamper: func(b string) { os.Truncate(b, int64(len(big)-1)) }},
		{name: "long", want: "is 2097153 bytes", tamper: func(b string) { os.WriteFile(b, append(bytes.Clone(big), 0), 0o600) }},
		{name: "other-bytes", want: "digest", tamper: func(b string) {
			x := bytes.Clone(big)
			x[12345] ^= 1
			os.WriteFile(b, x, 0o600)
		}},
		{name: "missing", want: "no such file", tamper: func(b string) { os.Remove(b) }},
		{name: "symlink", want: "not a regular file", tamper: func(b string) { os.Remove(b); os.Symlink(hostCopy, b) }},
		{name: "fifo", want: "not a regular file", tamper: func(b string) { os.Remove(b); unix.Mkfifo(b, 0o600) }},
		{name: "blob-dir-symlink", want: "blob directory", tamper: func(b string) {
			d := filepath.Dir(b)
			os.Rename(d, d+".real")
			os.Symlink(d+".real", d)
		}},
		{name: "key-dotdot", want: "bad blob key", recs: map[string]string{paxBlob: "../../host/marker", paxBlobSize: "11", paxBlobSHA256: good[paxBlobSHA256]}},
		{name: "key-absolute", want: "bad blob key", recs: map[string]string{paxBlob: hostCopy, paxBlobSize: good[paxBlobSize], paxBlobSHA256: good[paxBlobSHA256]}},
		{name: "size-record", want: "is 2097152 bytes, the archive says 5", recs: map[string]string{paxBlob: key, paxBlobSize: "5", paxBlobSHA256: good[paxBlobSHA256]}},
		{name: "bad-digest-record", want: "bad blob digest", recs: map[string]string{paxBlob: key, paxBlobSize: good[paxBlobSize], paxBlobSHA256: "zz"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "img")
			if err := os.MkdirAll(filepath.Join(dir, BlobDirName), 0o700); err != nil {
				t.Fatal(err)
			}
			tarb, _ := os.ReadFile(filepath.Join(img, "layer.tar"))
			if c.recs != nil {
				tarb = refTar(t, c.recs)
			}
			if err := os.WriteFile(filepath.Join(dir, "layer.tar"), tarb, 0o600); err != nil {
				t.Fatal(err)
			}
			blob := filepath.Join(dir, BlobDirName, key)
			if err := os.WriteFile(blob, big, 0o600); err != nil {
				t.Fatal(err)
			}
			if c.tamper != nil {
				c.tamper(blob)
			}
			done := make(chan error, 1)
			go func() {
				_, err := ExtractArchiveFile(filepath.Join(dir, "layer.tar"), t.TempDir(), ArchiveOptions{})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the extraction opened the FIFO")
			}
			if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v, want a data-loss refusal saying %q", err, c.want)
			}
			unchanged()
		})
	}
	// A reference read without a blob directory.
	b, _ := os.ReadFile(filepath.Join(img, "layer.tar"))
	if _, err := ExtractArchive(bytes.NewReader(b), t.TempDir(), ArchiveOptions{}); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "no blob directory") {
		t.Errorf("no blob directory: %v", err)
	}
	// WriteArchive (to a stream) has nowhere to put blobs.
	if _, err := WriteArchive(io.Discard, src, ArchiveOptions{BlobCache: cache}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("WriteArchive with a blob cache: %v", err)
	}
}

// BenchmarkArchive64MiB: the frozen part of a cut of a layer holding one
// unchanged 64 MiB file — every byte archived (no cache), against the
// cache's link (issue 21).
func BenchmarkArchive64MiB(b *testing.B) {
	src := b.TempDir()
	big := make([]byte, 64<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "fill"), big, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		cache string
	}{{"full", ""}, {"blobs", filepath.Join(b.TempDir(), "cache")}} {
		b.Run(c.name, func(b *testing.B) {
			o := ArchiveOptions{BlobCache: c.cache}
			if c.cache != "" { // the first cut copies
				if _, _, err := WriteArchiveFile(filepath.Join(b.TempDir(), "layer.tar"), src, o); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				dir := b.TempDir()
				cut, err := CutArchiveFile(filepath.Join(dir, "layer.tar"), src, o)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := cut.Commit(); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(dir)
				b.StartTimer()
			}
		})
	}
}
