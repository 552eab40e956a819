package layer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestArchiveBlobsSeededByRestore: an extraction given the restored
// layer's (new) cache seeds it with the blobs it copied, so the first cut
// after the restore links the same blob files into its image and copies
// nothing; the reused seeded entries are durable in the index after that
// cut; a file changed after the restore is copied again; and a cache on
// another filesystem than the image (no hard link) is not seeded: the cut
// copies, as before.
func TestArchiveBlobsSeededByRestore(t *testing.T) {
	for _, m := range archiveIDMaps {
		t.Run(m.name, func(t *testing.T) {
			src := t.TempDir()
			makeUpper(t, src, m.ids)
			addBigFiles(t, src, m.ids)
			ar1 := filepath.Join(t.TempDir(), "layer.tar")
			if _, _, err := WriteArchiveFile(ar1, src, ArchiveOptions{IDs: m.ids, BlobCache: filepath.Join(t.TempDir(), "cache")}); err != nil {
				t.Fatal(err)
			}
			refs1 := blobsOf(t, ar1)

			dst, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
			if _, err := ExtractArchiveFile(ar1, dst, ArchiveOptions{IDs: m.ids, BlobCache: cache}); err != nil {
				t.Fatal(err)
			}
			if ix := readIndex(t, cache); len(ix.Files) != 2 || !ix.Files["big/a"].Unsynced || !ix.Files["big/b"].Unsynced {
				t.Fatalf("seeded index %+v, want big/a and big/b, unsynced", ix.Files)
			}
			cut := func(upper, cache string) (*ArchiveCut, string) {
				t.Helper()
				ar := filepath.Join(t.TempDir(), "layer.tar")
				c, err := CutArchiveFile(ar, upper, ArchiveOptions{IDs: m.ids, BlobCache: cache})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Commit(); err != nil {
					t.Fatal(err)
				}
				return c, ar
			}
			c2, ar2 := cut(dst, cache)
			if c2.Reused != 2 || c2.Copied != 0 {
				t.Fatalf("first cut after the restore: %d reused, %d copied; want 2 and 0", c2.Reused, c2.Copied)
			}
			for name, k := range blobsOf(t, ar2) {
				if k != refs1[name] || inode(t, filepath.Join(filepath.Dir(ar2), BlobDirName, k)) != inode(t, filepath.Join(filepath.Dir(ar1), BlobDirName, k)) {
					t.Errorf("%s: the cut after the restore made a new blob (%s, was %s)", name, k, refs1[name])
				}
			}
			for name, e := range readIndex(t, cache).Files {
				if e.Unsynced {
					t.Errorf("%s: still unsynced after the cut that reused it", name)
				}
			}
			// A restored file changed: that one is copied.
			f, err := os.OpenFile(filepath.Join(dst, "big/b"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("more")
			f.Close()
			if c3, _ := cut(dst, cache); c3.Reused != 1 || c3.Copied != 1 {
				t.Errorf("after big/b changed: %d reused, %d copied; want 1 and 1", c3.Reused, c3.Copied)
			}

			// The cache on another filesystem: nothing seeded.
			var a, b unix.Stat_t
			if unix.Stat("/dev/shm", &b) != nil || unix.Stat(filepath.Dir(ar1), &a) != nil || a.Dev == b.Dev {
				t.Skip("no second filesystem (/dev/shm) here")
			}
			far, err := os.MkdirTemp("/dev/shm", "amber-blobseed-")
			if err != nil {
				t.Skip(err)
			}
			defer os.RemoveAll(far)
			dst2 := t.TempDir()
			if _, err := ExtractArchiveFile(ar1, dst2, ArchiveOptions{IDs: m.ids, BlobCache: filepath.Join(far, "cache")}); err != nil {
				t.Fatal(err)
			}
			if c4, _ := cut(dst2, filepath.Join(far, "cache")); c4.Reused != 0 || c4.Copied != 2 {
				t.Errorf("cache on another filesystem: %d reused, %d copied; want 0 and 2", c4.Reused, c4.Copied)
			}
		})
	}
}

func readIndex(t *testing.T, cache string) blobIndex {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cache, blobIndexName))
	if err != nil {
		t.Fatal(err)
	}
	var ix blobIndex
	if err := json.Unmarshal(b, &ix); err != nil {
		t.Fatal(err)
	}
	return ix
}
