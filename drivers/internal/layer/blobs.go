package layer

// Blob references: the incremental part of the layer archive.
//
// A large file that sits unchanged in the upper directory (a 64 MiB
// dataset, a model, a virtualenv's wheel) used to be copied into every
// cut's layer.tar while the sandbox was frozen, and fsync'd before the cut
// was acknowledged. With ArchiveOptions.BlobCache set, WriteArchiveFile
// instead stores each regular file of at least BlobMinSize bytes as a
// blob: a file of the image directory, BlobDirName/<key>, that is a hard
// link to the driver's cache file <BlobCache>/<key>. The archive's entry
// is a regular file with no bytes and the PAX records
//
//	AMBER.blob=<key>            32 lower-case hex digits (random)
//	AMBER.blob.size=<bytes>     the file's size
//	AMBER.blob.sha256=<hex>     the SHA-256 of its bytes
//
// besides its usual mode, owner, times and xattrs.
//
// # The cache
//
// The cache is per sandbox, in the driver's state directory (removed with
// the sandbox, and when a restore replaces its layer, whose extraction
// seeds a new one: blobseed.go). Its index.json
// records, per relative path, the key of the cache file made from it and
// the file's size, modification and change times (ns), inode and device at
// that moment. A cut reuses the cache file of a path whose file still has
// all six (a hard link, no bytes copied); any other large file is copied
// into a new cache file while the sandbox is frozen — what layer.tar's
// copy cost before — its digest computed on the way, checked unchanged
// afterwards, and referenced. The change time is what makes "unchanged"
// sound: every write, truncate, chmod, chown, xattr change or rename
// through the kernel sets it to the current time, and no system call sets
// it to a chosen value (only a change of the host's clock within the
// timestamp granularity, or writing the block device under the
// filesystem, could forge it). A cache file is never written once made (a
// changed file gets a new key), so the images and hot copies that link it
// keep their bytes. After the thaw, ArchiveCut.Commit fsyncs the new cache
// files, then replaces the index (temporary file, fsync, rename, fsync of
// the directory) and removes every cache file the cut did not reference;
// a failed cut (Abort) removes the cache files it made and keeps the old
// index, so the index only ever names durable files.
//
// # Restore
//
// ExtractArchive creates the entry's file as for any regular file and
// copies the blob's bytes into it (a new inode: the sandbox never gets a
// name of the cache's inode), refusing as ErrDataLoss a key that is not 32
// hex digits (a name with "/" or ".." never reaches a lookup), a blob that
// is not a regular file of the blob directory (opened O_NOFOLLOW under a
// descriptor of it), a blob whose size is not AMBER.blob.size, and bytes
// whose SHA-256 is not AMBER.blob.sha256. An image carries its blobs as
// ordinary files: the chunk store stores and deduplicates them, and a
// restore on another node finds them in the image directory it fetched.
// Archives without references (every archive made before, or with no
// BlobCache) read as before.

import (
	"archive/tar"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

const (
	// BlobDirName is the image directory's directory of blobs, beside
	// layer.tar.
	BlobDirName = "layer-blobs"
	// BlobMinSize is the size from which a regular file is a blob.
	BlobMinSize = 1 << 20

	paxBlob       = "AMBER.blob"
	paxBlobSize   = "AMBER.blob.size"
	paxBlobSHA256 = "AMBER.blob.sha256"

	blobIndexName    = "index.json"
	blobIndexVersion = 1
)

// blobEntry is a cache file, and the file of the upper directory it was
// made from as it was then.
type blobEntry struct {
	Key     string `json:"key"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
	Ino     uint64 `json:"ino"`
	Dev     uint64 `json:"dev"`
	// Unsynced: a restore seeded the entry (blobseed.go) and no fsync of
	// the cache file is known; the cut that reuses it fsyncs it first.
	Unsynced bool `json:"unsynced,omitempty"`
}

type blobIndex struct {
	Version int                  `json:"version"`
	Files   map[string]blobEntry `json:"files"` // by relative path in the upper
}

func statMatches(e blobEntry, st *unix.Stat_t) bool {
	return e.Size == st.Size && e.MtimeNS == st.Mtim.Nano() && e.CtimeNS == st.Ctim.Nano() &&
		e.Ino == st.Ino && e.Dev == st.Dev
}

// validBlobKey: 32 lower-case hex digits, so a key is a single name.
func validBlobKey(k string) bool {
	if len(k) != 32 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// blobWriter makes the blob references of one CutArchiveFile.
type blobWriter struct {
	cache   string // the cache directory (the daemon's)
	blobDir string // the image's BlobDirName
	madeDir bool
	old     map[string]blobEntry
	now     map[string]blobEntry
	created []string // keys of cache files made by this cut
	synced  []string // keys of seeded cache files this cut reused (Unsynced)
	// Reused, Copied count the references of this cut by how they were
	// made (tests, logs).
	reused, copied int
	bytes          int64
}

func newBlobWriter(cache, imageDir string) (*blobWriter, error) {
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return nil, fmt.Errorf("layer blob cache: %w", err)
	}
	w := &blobWriter{cache: cache, blobDir: filepath.Join(imageDir, BlobDirName), now: map[string]blobEntry{}}
	b, err := os.ReadFile(filepath.Join(cache, blobIndexName))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("layer blob cache: %w", err)
	default:
		// An index that does not parse (or of another version) is no
		// cache: every file is copied again, and the sweep after the
		// cut removes its files.
		var ix blobIndex
		if json.Unmarshal(b, &ix) == nil && ix.Version == blobIndexVersion {
			w.old = ix.Files
		}
	}
	return w, nil
}

// ref returns the PAX records that reference the blob of the large regular
// file f, named name in the upper and statted as st (f is open for reading
// at its start): the cache's file for it if it is unchanged, else a new
// one copied from f.
func (w *blobWriter) ref(name string, f *os.File, st *unix.Stat_t) (map[string]string, error) {
	e, ok := w.old[name]
	if ok && statMatches(e, st) && validBlobKey(e.Key) {
		if fi, err := os.Lstat(filepath.Join(w.cache, e.Key)); err == nil && fi.Mode().IsRegular() && fi.Size() == e.Size {
			w.reused++
			if e.Unsynced {
				w.synced = append(w.synced, e.Key)
				e.Unsynced = false // commit fsyncs it before its index says so
			}
		} else {
			ok = false
		}
	} else {
		ok = false
	}
	if !ok {
		var err error
		if e, err = w.copy(name, f, st); err != nil {
			return nil, err
		}
		w.copied++
	}
	if err := w.link(e.Key); err != nil {
		return nil, fmt.Errorf("layer archive: %s: blob: %w", name, err)
	}
	w.now[name] = e
	w.bytes += e.Size
	return map[string]string{paxBlob: e.Key, paxBlobSize: strconv.FormatInt(e.Size, 10), paxBlobSHA256: e.SHA256}, nil
}

// copy makes a new cache file of f's st.Size bytes (fsynced by commit)
// and checks that f did not change meanwhile.
func (w *blobWriter) copy(name string, f *os.File, st *unix.Stat_t) (blobEntry, error) {
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return blobEntry{}, err
	}
	key := hex.EncodeToString(r[:])
	cf, err := os.OpenFile(filepath.Join(w.cache, key), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return blobEntry{}, fmt.Errorf("layer blob cache: %w", err)
	}
	w.created = append(w.created, key)
	defer cf.Close()
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(cf, h), f, st.Size); err != nil {
		if errors.Is(err, io.EOF) {
			return blobEntry{}, changed(name, err)
		}
		return blobEntry{}, fmt.Errorf("layer archive: %s: %w", name, err)
	}
	var after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &after); err != nil || after.Size != st.Size || after.Mtim != st.Mtim || after.Ctim != st.Ctim {
		return blobEntry{}, changed(name, err)
	}
	// Not fsynced here: commit does, after the sandbox is thawed.
	if err := cf.Close(); err != nil {
		return blobEntry{}, fmt.Errorf("layer blob cache: %w", err)
	}
	return blobEntry{Key: key, SHA256: hex.EncodeToString(h.Sum(nil)), Size: st.Size,
		MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano(), Ino: st.Ino, Dev: st.Dev}, nil
}

// link puts the cache file key into the image's blob directory: a hard
// link, or a copy where the image is on another filesystem.
func (w *blobWriter) link(key string) error {
	if !w.madeDir {
		if err := os.Mkdir(w.blobDir, 0o700); err != nil {
			return err
		}
		w.madeDir = true
	}
	src, dst := filepath.Join(w.cache, key), filepath.Join(w.blobDir, key)
	err := os.Link(src, dst)
	if !errors.Is(err, unix.EXDEV) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// commit makes this cut's references the cache's (the index replaced
// durably), then removes the cache files nothing references.
func (w *blobWriter) commit() error {
	for _, k := range append(w.created, w.synced...) {
		if err := syncFile(filepath.Join(w.cache, k)); err != nil {
			return fmt.Errorf("layer blob cache: %w", err)
		}
	}
	b, err := json.Marshal(blobIndex{Version: blobIndexVersion, Files: w.now})
	if err != nil {
		return err
	}
	tmp := filepath.Join(w.cache, blobIndexName+".tmp")
	if err := writeSyncedFile(tmp, b); err != nil {
		return fmt.Errorf("layer blob cache: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(w.cache, blobIndexName)); err != nil {
		return fmt.Errorf("layer blob cache: %w", err)
	}
	w.created = nil // the index names them now: abort must not remove them
	if err := syncDirPath(w.cache); err != nil {
		return fmt.Errorf("layer blob cache: %w", err)
	}
	keep := map[string]bool{blobIndexName: true}
	for _, e := range w.now {
		keep[e.Key] = true
	}
	ents, err := os.ReadDir(w.cache)
	if err != nil {
		return fmt.Errorf("layer blob cache: %w", err)
	}
	for _, de := range ents {
		if !keep[de.Name()] {
			if err := os.Remove(filepath.Join(w.cache, de.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("layer blob cache: %w", err)
			}
		}
	}
	return nil
}

// abort removes the cache files a failed cut made.
func (w *blobWriter) abort() {
	for _, k := range w.created {
		_ = os.Remove(filepath.Join(w.cache, k))
	}
}

func writeSyncedFile(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncDirPath(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// blobReader resolves references at extraction: the blob directory is
// opened once, by descriptor.
type blobReader struct {
	dir string
	fd  int // -1 until first used
}

func (b *blobReader) close() {
	if b != nil && b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
}

// isBlobRef reports whether hdr references a blob.
func isBlobRef(hdr *tar.Header) bool {
	_, ok := hdr.PAXRecords[paxBlob]
	return ok
}

// copyBlob copies the blob hdr references into dst (the new file of the
// entry name), checking its key, type, size and digest.
func (b *blobReader) copyBlob(dst *os.File, name string, hdr *tar.Header) error {
	key := hdr.PAXRecords[paxBlob]
	if !validBlobKey(key) {
		return errdefs.DataLossf("layer archive: %s: bad blob key %q", name, key)
	}
	size, err := strconv.ParseInt(hdr.PAXRecords[paxBlobSize], 10, 64)
	if err != nil || size < 0 || hdr.Size != 0 {
		return errdefs.DataLossf("layer archive: %s: bad blob size %q (entry size %d)", name, hdr.PAXRecords[paxBlobSize], hdr.Size)
	}
	want, err := hex.DecodeString(hdr.PAXRecords[paxBlobSHA256])
	if err != nil || len(want) != sha256.Size {
		return errdefs.DataLossf("layer archive: %s: bad blob digest %q", name, hdr.PAXRecords[paxBlobSHA256])
	}
	if b == nil || b.dir == "" {
		return errdefs.DataLossf("layer archive: %s references blob %s, and the archive has no blob directory", name, key)
	}
	if b.fd < 0 {
		fd, err := unix.Open(b.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return errdefs.DataLossf("layer archive: %s references blob %s: blob directory %s: %v", name, key, b.dir, err)
		}
		b.fd = fd
	}
	// O_PATH first (opens nothing), then the very inode if it is a
	// regular file: a FIFO or device put there is never opened.
	opath, err := unix.Openat(b.fd, key, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errdefs.DataLossf("layer archive: %s: blob %s: %v", name, key, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(opath, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(opath)
		return errdefs.DataLossf("layer archive: %s: blob %s is not a regular file (%v)", name, key, err)
	}
	if st.Size != size {
		unix.Close(opath)
		return errdefs.DataLossf("layer archive: %s: blob %s is %d bytes, the archive says %d", name, key, st.Size, size)
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(opath), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	unix.Close(opath)
	if err != nil {
		return fmt.Errorf("layer archive: %s: blob %s: %w", name, key, err)
	}
	src := os.NewFile(uintptr(fd), key)
	defer src.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, h), io.LimitReader(src, size))
	if err != nil {
		return fmt.Errorf("layer archive: %s: blob %s: %w", name, key, err)
	}
	if n != size {
		return errdefs.DataLossf("layer archive: %s: blob %s ended after %d of %d bytes", name, key, n, size)
	}
	if !sumIs(h, want) {
		return errdefs.DataLossf("layer archive: %s: blob %s does not have the digest the archive records", name, key)
	}
	return nil
}

func sumIs(h hash.Hash, want []byte) bool {
	got := h.Sum(nil)
	return string(got) == string(want)
}
