package criu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// imageVersionOf is the format version in imageDir's image.json.
func imageVersionOf(t *testing.T, imageDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(imageDir, "image.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Version int }
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m.Version
}

// onlyBlob returns the one blob of an image and its inode.
func onlyBlob(t *testing.T, imageDir string) (string, uint64) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(imageDir, layer.BlobDirName))
	if err != nil || len(ents) != 1 {
		t.Fatalf("image %s blobs: %v %v, want one", imageDir, ents, err)
	}
	p := filepath.Join(imageDir, layer.BlobDirName, ents[0].Name())
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return p, st.Ino
}

// TestCheckpointLayerBlobs (issue 21): two cuts of a sandbox whose layer
// holds a 64 MiB file that did not change between them write its bytes
// once — the second image's layer.tar is small and its blob is the first
// image's inode (the driver's blob cache) — and a restore from the second
// image gives the file back, byte for byte, in an inode of its own, owned
// as it was; Destroy removes the cache, not the images' blobs.
func TestCheckpointLayerBlobs(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	cut := func() (string, sandbox.CheckpointStats) {
		t.Helper()
		dir := t.TempDir()
		cs, err := td.Checkpoint(ctx, id, dir, sandbox.CheckpointOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cut: frozen %v, total %v, layer %d B", cs.Frozen, cs.Total, cs.LayerBytes)
		return dir, cs
	}
	img0, _ := cut()
	if v := imageVersionOf(t, img0); v != imageFormatVersion {
		t.Errorf("image without blobs: format %d, want %d", v, imageFormatVersion)
	}
	sum := td.sh(id, `dd if=/dev/urandom of=/root/big.bin bs=1048576 count=64 2>/dev/null && chown 1000:1000 /root/big.bin && sha256sum /root/big.bin && stat -c '%u %g %a' /root/big.bin`)
	img1, _ := cut()
	if v := imageVersionOf(t, img1); v != imageFormatVersion {
		t.Errorf("image with a blob: format %d, want %d", v, imageFormatVersion)
	}
	img2, cs2 := cut()
	if fi, err := os.Stat(filepath.Join(img2, "layer.tar")); err != nil || fi.Size() > 1<<20 {
		t.Errorf("second cut's layer.tar: %v %v: the unchanged 64 MiB file was archived again", fi, err)
	}
	if cs2.LayerBytes < 64<<20 {
		t.Errorf("second cut's layer: %d bytes, want the 64 MiB file counted", cs2.LayerBytes)
	}
	blob1, ino1 := onlyBlob(t, img1)
	blob2, ino2 := onlyBlob(t, img2)
	if ino1 != ino2 || filepath.Base(blob1) != filepath.Base(blob2) {
		t.Errorf("second cut's blob %s (inode %d) is not the first's %s (%d)", blob2, ino2, blob1, ino1)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	if _, err := td.Restore(ctx, spec, img2, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := td.sh(id, `sha256sum /root/big.bin && stat -c '%u %g %a' /root/big.bin`); got != sum {
		t.Fatalf("restored file: %q, cut %q", got, sum)
	}
	l, err := layer.Open(td.layerDir(id))
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(l.Upper(), "root/big.bin"), &st); err != nil || st.Ino == ino2 || st.Nlink != 1 {
		t.Errorf("restored file: inode %d (blob %d), %d links, %v: not a file of its own", st.Ino, ino2, st.Nlink, err)
	}
	// The restore seeded the new cache with the image's blob
	// (drivers/internal/layer/blobseed.go): the cuts after it copy nothing.
	img3, cs3 := cut()
	_, ino3 := onlyBlob(t, img3)
	img4, _ := cut()
	if _, ino4 := onlyBlob(t, img4); ino4 != ino3 || ino3 != ino2 {
		t.Errorf("cuts after the restore: blobs %d then %d, want the restored image's %d (no copy)", ino3, ino4, ino2)
	}
	t.Logf("first cut after the restore: frozen %v (the 64 MiB file not copied)", cs3.Frozen)
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(td.blobCacheDir(id)); !os.IsNotExist(err) {
		t.Errorf("blob cache after Destroy: %v", err)
	}
	if fi, err := os.Stat(blob2); err != nil || fi.Size() != 64<<20 {
		t.Errorf("the second image's blob after Destroy: %v %v", fi, err)
	}
}
