package layer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Seeding the cache at a restore.
//
// A restore replaces the sandbox's layer, and with it the files its blob
// cache described: the cache used to be removed, so the first cut after
// every restore copied each large file again, inside its frozen window
// (the benchmark's 2.6 MiB ticker: 30 ms of a criu cut's freeze). With
// ArchiveOptions.BlobCache set, ExtractArchive seeds the new cache
// instead: each blob it copied (and checked against the archive's digest)
// is hard-linked from the image's blob directory into the cache under its
// key, and the index records the restored file as it stands once the whole
// archive is extracted (size, times, inode: a later hard link to it
// changes its change time, so it is read at the end). The next cut finds
// the file unchanged and links the same cache file into its image, no byte
// copied. A blob that cannot be linked (the image on another filesystem,
// or any error) is not seeded: that cut copies it, as before. Seeding is a
// hint and never fails a restore.
//
// Durability: the index is written without an fsync (a crash loses the
// sandbox with its cache: the next restore seeds a new one), and its
// entries are marked unsynced; a cut that reuses one fsyncs that cache
// file in Commit, with the files it made, before its index names it as
// durable (a hot copy's blob was fsynced by the cut that made it, so that
// costs nothing; a freshly fetched one pays its writeback there, after the
// thaw).

// seed is one blob ExtractArchive copied into the restored file name.
type seed struct {
	name, key, sha256 string
	size              int64
	dev, ino          uint64
}

// seedBlobCache makes cache (removed before, by the driver) the cache of
// the restored files of seeds, found under root, their blobs linked from
// the blob directory blobFD.
func seedBlobCache(cache string, root, blobFD int, seeds []seed) {
	if len(seeds) == 0 || blobFD < 0 {
		return
	}
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return
	}
	cfd, err := unix.Open(cache, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(cfd)
	files := map[string]blobEntry{}
	for _, s := range seeds {
		var st unix.Stat_t
		if unix.Fstatat(root, s.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
			st.Dev != s.dev || st.Ino != s.ino || st.Size != s.size {
			continue
		}
		if err := unix.Linkat(blobFD, s.key, cfd, s.key, 0); err != nil && !errors.Is(err, unix.EEXIST) {
			continue
		}
		files[s.name] = blobEntry{Key: s.key, SHA256: s.sha256, Size: s.size, MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano(),
			Ino: st.Ino, Dev: st.Dev, Unsynced: true}
	}
	if len(files) == 0 {
		return
	}
	b, err := json.Marshal(blobIndex{Version: blobIndexVersion, Files: files})
	if err != nil {
		return
	}
	tmp := filepath.Join(cache, blobIndexName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return
	}
	_ = os.Rename(tmp, filepath.Join(cache, blobIndexName))
}
