package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
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
// image gives the file back, byte for byte, in an inode of its own; a
// file changed after the second cut is copied at the third.
func TestCheckpointLayerBlobs(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-blobs")
	id := fmt.Sprintf("blobs-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	cut := func(name string) (string, sandbox.CheckpointStats) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), name)
		cs, err := d.Checkpoint(ctx, id, dir, sandbox.CheckpointOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: frozen %v, total %v, layer %d B", name, cs.Frozen, cs.Total, cs.LayerBytes)
		return dir, cs
	}
	// An image without a large file stays of format 1 (what binaries
	// from before blobs read); one with blobs is 2.
	if img0, _ := cut("image0"); imageVersionOf(t, img0) != imageVersionNoBlobs {
		t.Errorf("image without blobs: format %d", imageVersionOf(t, img0))
	}
	sum := mustSh(t, d, id, `dd if=/dev/urandom of=/root/big.bin bs=1M count=64 2>/dev/null && sha256sum /root/big.bin`)
	img1, _ := cut("image1")
	if v := imageVersionOf(t, img1); v != imageVersion {
		t.Errorf("image with a blob: format %d, want %d", v, imageVersion)
	}
	img2, cs2 := cut("image2")
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
	if fi, err := os.Stat(blob2); err != nil || fi.Size() != 64<<20 {
		t.Fatalf("blob: %v %v", fi, err)
	}

	killStopped(t, d, id)
	if _, err := d.Restore(ctx, spec, img2, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, d, id, `sha256sum /root/big.bin`); got != sum {
		t.Fatalf("restored file: %q, cut %q", got, sum)
	}
	l, err := layer.Open(d.layerDir(id))
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(l.Upper(), "root/big.bin"), &st); err != nil || st.Ino == ino2 || st.Nlink != 1 {
		t.Errorf("restored file: inode %d (blob %d), %d links, %v: not a file of its own", st.Ino, ino2, st.Nlink, err)
	}
	// The restore seeded the new cache with the image's blob
	// (drivers/internal/layer/blobseed.go): a cut right after it copies
	// nothing. Then the file changes: the next cut copies it once, the
	// one after links it.
	imgR, _ := cut("image-restored")
	if _, inoR := onlyBlob(t, imgR); inoR != ino2 {
		t.Errorf("cut after the restore: blob inode %d, want the restored image's %d (no copy)", inoR, ino2)
	}
	mustSh(t, d, id, `echo x >> /root/big.bin`)
	img3, _ := cut("image3")
	_, ino3 := onlyBlob(t, img3)
	if ino3 == ino2 {
		t.Errorf("third cut (file changed): blob inode %d, the second's", ino3)
	}
	img4, _ := cut("image4")
	if _, ino4 := onlyBlob(t, img4); ino4 != ino3 {
		t.Errorf("fourth cut's blob %d is not the third's %d", ino4, ino3)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.blobCacheDir(id)); !os.IsNotExist(err) {
		t.Errorf("blob cache after Destroy: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(img2, layer.BlobDirName, filepath.Base(blob2))); err != nil || len(b) != 64<<20 {
		t.Errorf("the second image's blob after Destroy: %d B %v", len(b), err)
	}
}
