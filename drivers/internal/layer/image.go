package layer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// blockSize is the ext4 block size and the loop device's logical block size.
const blockSize = 4096

// journalMiB is the size of the ext4 journal. A journal makes the layer
// survive a host crash without fsck (the kernel replays it at mount); 4 MiB
// is the smallest mke2fs accepts and costs nothing at format time (it is not
// written; the image is sparse, so it reads as zeros).
const journalMiB = 4

// mkfsArgs formats a sparse, all-zero image:
//
//	-b 4096 -I 256 -i 16384  4 KiB blocks, one 256-byte inode per 16 KiB
//	-m 0                     no blocks reserved for root: the limit is the tenant's
//	-J size=4                small journal (see journalMiB)
//	-O ^resize_inode         no reserved GDT blocks; online growth still works (meta_bg)
//	-E assume_storage_prezeroed=1
//	                         the storage reads as zeros: skip zeroing inode tables
//	                         and journal, and mark them zeroed so the kernel does
//	                         not start its lazy-init thread (background writes
//	                         that would un-sparse every image)
//
// mkfsFallbackExtended is for e2fsprogs < 1.47, which lacks
// assume_storage_prezeroed; the mount option noinit_itable then keeps the
// lazy-init thread off (safe for the same reason: the tables read as zeros).
var (
	mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-i", "16384", "-m", "0",
		"-J", fmt.Sprintf("size=%d", journalMiB), "-O", "^resize_inode", "-L", "amber-layer"}
	mkfsExtended         = "assume_storage_prezeroed=1"
	mkfsFallbackExtended = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
)

// extent is a run of non-zero data in a formatted image.
type extent struct {
	off  int64
	data []byte
}

// protoCache holds, per image size, the data extents of a freshly formatted
// image. Formatting costs one exec of mke2fs, which dominates Create on
// hosts where exec is slow (~30 ms on the VMs we measured, mostly process
// start); copying the ~150 KiB of extents into a new sparse file costs well
// under a millisecond. All layers of one size therefore share the
// filesystem UUID, as device-mapper thin snapshots of one base device did
// for Docker's devicemapper driver: ext4 does not need UUIDs to be unique,
// and nothing here mounts by UUID.
var protoCache struct {
	mu    sync.Mutex
	bySiz map[int64]*proto
}

type proto struct {
	once    sync.Once
	extents []extent
	err     error
}

// maxProtos bounds the cache; sizes come from a few plans, so this is
// generous. The oldest entry is evicted arbitrarily (map order) — a miss
// only costs one mke2fs.
const maxProtos = 16

func prototype(size int64) ([]extent, error) {
	protoCache.mu.Lock()
	if protoCache.bySiz == nil {
		protoCache.bySiz = make(map[int64]*proto)
	}
	p := protoCache.bySiz[size]
	if p == nil {
		if len(protoCache.bySiz) >= maxProtos {
			for k := range protoCache.bySiz {
				delete(protoCache.bySiz, k)
				break
			}
		}
		p = &proto{}
		protoCache.bySiz[size] = p
	}
	protoCache.mu.Unlock()
	p.once.Do(func() { p.extents, p.err = format(size) })
	if p.err != nil {
		protoCache.mu.Lock()
		if protoCache.bySiz[size] == p {
			delete(protoCache.bySiz, size) // retry next time
		}
		protoCache.mu.Unlock()
	}
	return p.extents, p.err
}

// format runs mke2fs on a memfd of the given size (tmpfs-backed, sparse, so
// only the metadata mke2fs writes costs memory, and fsync is free) and
// returns the written extents.
func format(size int64) ([]extent, error) {
	fd, err := unix.MemfdCreate("amber-layer-format", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("truncate memfd: %w", err)
	}
	mkfs, err := findMkfs()
	if err != nil {
		return nil, err
	}
	run := func(ext string) (string, error) {
		args := append(append([]string{}, mkfsArgs...), "-E", ext, "/proc/self/fd/3")
		cmd := exec.Command(mkfs, args...)
		cmd.ExtraFiles = []*os.File{f}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return strings.TrimSpace(out.String()), err
	}
	if out, err := run(mkfsExtended); err != nil {
		if !strings.Contains(out, "assume_storage_prezeroed") {
			return nil, fmt.Errorf("%s: %v: %s", mkfs, err, out)
		}
		if out, err := run(mkfsFallbackExtended); err != nil {
			return nil, fmt.Errorf("%s: %v: %s", mkfs, err, out)
		}
	}
	return readExtents(f, size)
}

func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found (apt-get install e2fsprogs)")
}

// readExtents reads the data (non-hole) ranges of f with SEEK_DATA/SEEK_HOLE.
func readExtents(f *os.File, size int64) ([]extent, error) {
	var out []extent
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data after off
		}
		if err != nil {
			return nil, fmt.Errorf("SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("SEEK_HOLE: %w", err)
		}
		buf := make([]byte, hole-data)
		if _, err := f.ReadAt(buf, data); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read memfd: %w", err)
		}
		out = append(out, extent{off: data, data: buf})
		off = hole
	}
	return out, nil
}

// writeImage creates path as a sparse file of size bytes holding the
// prototype's extents. O_EXCL: never reuse or truncate an existing image.
func writeImage(path string, size int64) (*os.File, error) {
	ext, err := prototype(size)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	for _, e := range ext {
		if _, err := f.WriteAt(e.data, e.off); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}
