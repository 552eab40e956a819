package engine

// A layer archive's blob references, read by copyLayer (upgrade). The
// format is drivers/internal/layer's (blobs.go), which this package may not
// import: a regular-file entry with no bytes and the PAX records
// AMBER.blob (32 hex digits: the name of the file in the image's
// layer-blobs/ directory), AMBER.blob.size and AMBER.blob.sha256. The
// image directory is the daemon's (fetched from the chunk store), the
// archive is data: a key that is not a single name, a blob that is not a
// regular file or not of the recorded size and digest is ErrDataLoss, as
// the drivers' extraction refuses it.

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/amber-run/amber/core/errdefs"
)

// isLayerBlob tells the chunk store which files of an image it may take
// from the parent checkpoint's manifest unread (PutOptions.Unchanged): a
// layer blob's name is the key of a cache file the driver never writes
// once made (drivers/internal/layer/blobs.go), random per file, so the
// same name of the same size is the same bytes. An upload then re-reads
// only what the cut changed, not every large file of the layer.
func isLayerBlob(path string) bool {
	return strings.HasPrefix(path, layerBlobDir+"/")
}

const (
	layerBlobDir     = "layer-blobs"
	paxLayerBlob     = "AMBER.blob"
	paxLayerBlobSize = "AMBER.blob.size"
	paxLayerBlobSum  = "AMBER.blob.sha256"
)

type layerBlob struct {
	name string
	f    *os.File
	size int64
	want []byte
}

// openLayerBlob opens the blob the entry h of the layer archive in
// imageDir references; nil, nil for an entry that references none.
func openLayerBlob(imageDir string, h *tar.Header) (*layerBlob, error) {
	key, ok := h.PAXRecords[paxLayerBlob]
	if !ok {
		return nil, nil
	}
	if len(key) != 32 {
		return nil, errdefs.DataLossf("layer.tar: %s: bad blob key %q", h.Name, key)
	}
	if _, err := hex.DecodeString(key); err != nil {
		return nil, errdefs.DataLossf("layer.tar: %s: bad blob key %q", h.Name, key)
	}
	size, err := strconv.ParseInt(h.PAXRecords[paxLayerBlobSize], 10, 64)
	if err != nil || size < 0 || h.Size != 0 {
		return nil, errdefs.DataLossf("layer.tar: %s: bad blob size %q", h.Name, h.PAXRecords[paxLayerBlobSize])
	}
	want, err := hex.DecodeString(h.PAXRecords[paxLayerBlobSum])
	if err != nil || len(want) != sha256.Size {
		return nil, errdefs.DataLossf("layer.tar: %s: bad blob digest %q", h.Name, h.PAXRecords[paxLayerBlobSum])
	}
	p := filepath.Join(imageDir, layerBlobDir, key)
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, errdefs.DataLossf("layer.tar: %s: blob %s: %v", h.Name, key, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		f.Close()
		return nil, errdefs.DataLossf("layer.tar: %s: blob %s is not a regular file of %d bytes (%v, %v)", h.Name, key, size, fi, err)
	}
	return &layerBlob{name: h.Name, f: f, size: size, want: want}, nil
}

// copyTo writes the blob's bytes to w, checking their digest.
func (b *layerBlob) copyTo(w io.Writer) error {
	var h hash.Hash = sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(b.f, b.size))
	if err != nil {
		return fmt.Errorf("layer.tar: %s: blob: %w", b.name, err)
	}
	if n != b.size || string(h.Sum(nil)) != string(b.want) {
		return errdefs.DataLossf("layer.tar: %s: blob %s does not have the size and digest the archive records", b.name, filepath.Base(b.f.Name()))
	}
	return nil
}

func (b *layerBlob) close() {
	if b != nil {
		b.f.Close()
	}
}
