package layer

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
// mounted ext4 to the given number of blocks.
const ext4IocResizeFS = 0x40086610

// hasCap reports whether the calling thread's effective set holds c.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// Grow enlarges the layer's disk limit to diskBytes (rounded down to a MiB)
// while it is mounted and in use — for a warm-pool sandbox that gets its
// tenant's limit when claimed. Shrinking is not possible
// (ErrInvalidArgument); the layer must be mounted (ErrFailedPrecondition);
// the kernel allows online growth only with CAP_SYS_RESOURCE
// (ErrNotImplemented without it, checked before anything changes).
//
// Steps: extend the sparse image (costs no host disk), tell the loop device
// its backing file grew (LOOP_SET_CAPACITY), grow the mounted ext4 online
// (EXT4_IOC_RESIZE_FS), and last rewrite the commit record. A crash before
// the record is rewritten leaves a larger image (and perhaps a larger
// filesystem) under the old recorded size; Grow again to finish.
func (l *Layer) Grow(diskBytes int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := diskBytes &^ (1<<20 - 1)
	if size < l.diskBytes {
		return errdefs.InvalidArgumentf("layer %s: cannot shrink from %d to %d bytes", l.dir, l.diskBytes, size)
	}
	if size == l.diskBytes {
		return nil
	}
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		return errdefs.NotImplementedf("layer %s: growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks", l.dir)
	}
	mounts, err := readMounts()
	if err != nil {
		return err
	}
	if !isMounted(mounts, l.fs()) {
		return errdefs.FailedPreconditionf("layer %s: not mounted", l.dir)
	}
	devs, err := loopsBackedBy(l.image())
	if err != nil || len(devs) == 0 {
		return errdefs.FailedPreconditionf("layer %s: no loop device for the image (%v)", l.dir, err)
	}
	if err := os.Truncate(l.image(), size); err != nil {
		return fmt.Errorf("layer %s: grow image: %w", l.dir, err)
	}
	for _, d := range devs {
		f, err := os.OpenFile(d, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0)
		f.Close()
		if err != nil {
			return fmt.Errorf("layer %s: LOOP_SET_CAPACITY %s: %w", l.dir, d, err)
		}
	}
	fs, err := os.Open(l.fs())
	if err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	defer fs.Close()
	blocks := uint64(size / blockSize)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fs.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&blocks))); e != 0 {
		return fmt.Errorf("layer %s: EXT4_IOC_RESIZE_FS: %w", l.dir, e)
	}
	m, err := readMeta(l.dir)
	if err != nil {
		return err
	}
	m.DiskBytes = size
	if err := writeMeta(l.dir, m); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	l.diskBytes = size
	return nil
}
