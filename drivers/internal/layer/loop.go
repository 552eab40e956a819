package layer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// attachLoop binds img to a free loop device with LOOP_CONFIGURE (one ioctl
// instead of losetup's SET_FD + SET_STATUS; no exec) and returns the open
// device. The device is configured with:
//
//   - LO_FLAGS_AUTOCLEAR: the kernel unbinds the device when its last opener
//     goes. The caller mounts it and closes the returned file, so the mount
//     becomes the only opener and unmounting frees the device; a daemon that
//     dies between attach and mount frees it too (its fd is closed on exit).
//   - LO_FLAGS_DIRECT_IO with 4 KiB logical blocks: reads and writes bypass
//     the page cache of the image file, so a sandbox's data is cached once (by
//     the ext4 inside) rather than twice. The kernel silently falls back to
//     buffered I/O where the host filesystem cannot do direct I/O.
//
// LOOP_CTL_GET_FREE can race with another process grabbing the same device;
// LOOP_CONFIGURE then fails with EBUSY and we ask again.
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/loop-control (is the loop module loaded?): %w", err)
	}
	defer ctl.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: blockSize}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], img.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) || attempt >= 20 {
			return nil, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev.Name(), err)
		}
	}
}

// loopsBackedBy returns the loop devices (as /dev/loopN) whose backing file
// is img, an absolute path without symlinks. It reads sysfs, which does not
// open the devices (opening an autoclear device would have side effects).
func loopsBackedBy(img string) ([]string, error) {
	matches, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue // unbound between Glob and ReadFile
		}
		f := strings.TrimSuffix(string(b), "\n")
		if f == img || f == img+" (deleted)" {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return out, nil
}

// detachLoops unbinds every loop device backed by img and waits (up to
// wait) until the kernel has released them. LOOP_CLR_FD on a device that is
// still open elsewhere only marks it autoclear (it is released with its last
// opener); that is the case the wait reports as an error.
func detachLoops(img string, wait time.Duration) error {
	devs, err := loopsBackedBy(img)
	if err != nil {
		return err
	}
	for _, d := range devs {
		f, err := os.OpenFile(d, os.O_RDWR, 0)
		if err != nil {
			continue // gone already
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.ENXIO) {
			return fmt.Errorf("LOOP_CLR_FD %s: %w", d, err)
		}
	}
	deadline := time.Now().Add(wait)
	for {
		devs, err := loopsBackedBy(img)
		if err != nil || len(devs) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loop device %s still in use", strings.Join(devs, ","))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
