// Package layer makes a sandbox's writable layer: an overlay of a private,
// size-bounded upper directory on top of a template's read-only root
// filesystem.
//
// # Layout
//
// A layer lives in one directory that it owns entirely:
//
//	DIR/layer.json   commit record: lower, disk size, format version
//	DIR/disk.img     sparse image file, ext4, exactly DiskBytes long
//	DIR/fs/          the image, loop-mounted (mode 0700)
//	DIR/fs/upper/    overlay upperdir: everything the sandbox wrote
//	DIR/fs/work/     overlay workdir
//	DIR/merged/      the overlay: lowerdir=template rootfs — the sandbox's root
//
// # Why an image file
//
// The disk limit must be firm: a sandbox that fills its disk gets ENOSPC from
// its own filesystem and the host's filesystem does not notice. The upper
// directory therefore lives on a filesystem of its own whose size is the
// limit. tmpfs with size= would be as firm but is charged to memory;
// project quotas (xfs or ext4 prjquota) would avoid the loop device but need
// the host filesystem formatted and mounted for them, which we cannot assume.
// A sparse image costs host disk only for what the sandbox writes. Note that
// the images are overcommitted: the sum of all limits may exceed the host's
// free space, and a sandbox that writes when the host disk is full gets EIO
// (ext4 then remounts its layer read-only) rather than ENOSPC.
//
// # Create, step by step
//
//  1. mkdir DIR (it must not exist, or be empty).
//  2. write DIR/disk.img: a sparse file holding a freshly formatted ext4 (see
//     protoCache: formatted once per size in memory, copied per layer).
//  3. attach it to a free loop device (LOOP_CONFIGURE, autoclear, direct I/O).
//  4. mount the loop device (ext4) on DIR/fs, then close the device: the
//     mount is its only opener, so unmounting DIR/fs frees the device.
//  5. mkdir DIR/fs/upper (mode and owner of the template's root, which the
//     overlay's root takes from it) and DIR/fs/work.
//  6. mount the overlay on DIR/merged.
//  7. write DIR/layer.json (temp file, fsync, rename, fsync DIR): from this
//     point the layer exists. Without it, the directory is a half-created
//     layer that Open refuses and Destroy removes.
//
// Create does not fsync the image: a host crash within seconds of Create can
// lose a still-empty layer (Open then fails with ErrDataLoss). Once the
// sandbox writes, ext4's journal commits flush the loop device, and through
// it the image file.
//
// # Cleanup order
//
// Destroy undoes Create from the top and works on any prefix of it (a crash
// at any step, or a Create that failed): unmount everything mounted under
// DIR, deepest first (the overlay, then the ext4, and anything a runtime
// mounted inside the merged tree); unbind any loop device still backed by
// DIR/disk.img; only then, when nothing is mounted under DIR any more,
// remove DIR. It never removes a directory tree that still has mounts in it.
//
// # Lifetime of the mounts
//
// Mounts live in the daemon's mount namespace and outlive the daemon: after a
// restart, Open finds them and does nothing; after a reboot, Open re-attaches
// the image and mounts both again (ext4 replays its journal). All layers of
// one size share an ext4 UUID (see protoCache).
//
// The overlay is mounted with index=off, redirect_dir=off and metacopy=off
// so that the upper directory is a self-contained diff of the template (full
// copies plus whiteouts), the form a checkpoint can archive. The cost:
// renaming a directory that comes from the template fails with EXDEV, which
// mv and most tools handle by copying.
package layer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// MinDiskBytes is the smallest layer Create makes.
const MinDiskBytes = 32 << 20

// loopReleaseWait is how long Destroy waits for the kernel to release the
// image's loop device after the last unmount.
var loopReleaseWait = 2 * time.Second

const (
	metaName   = "layer.json"
	imageName  = "disk.img"
	fsName     = "fs"
	mergedName = "merged"
	upperName  = "upper"
	workName   = "work"

	metaVersion = 1
)

// meta is the commit record DIR/layer.json.
type meta struct {
	Version   int       `json:"version"`
	Lower     string    `json:"lower"`
	DiskBytes int64     `json:"disk_bytes"`
	Created   time.Time `json:"created"`
}

// Layer is a sandbox's writable layer. Its methods are safe for concurrent
// use; the engine normally has one owner per sandbox.
type Layer struct {
	dir       string // absolute, symlinks resolved
	lower     string
	diskBytes int64

	mu         sync.Mutex
	handleUsed bool // the lower is a handle (isHandle) and was mounted
}

// Option modifies Create or Open.
type Option func(*options)

type options struct {
	lower string
}

// WithLower makes Open mount the overlay with path as its lower layer
// instead of the one recorded at Create. A driver whose lower layer is a
// per-process handle — a detached idmapped mount passed as /proc/self/fd/N —
// gives a fresh one to every Open: a handle is used for one mount only, so
// a Layer whose lower is a handle cannot be re-mounted with Mount after
// Unmount (ErrFailedPrecondition) — Open it again WithLower.
func WithLower(path string) Option { return func(o *options) { o.lower = path } }

// Create makes a layer in dir on top of lower (the template's root
// filesystem, used read-only) whose writable part is bounded to diskBytes
// (rounded down to a MiB; at least MinDiskBytes), and mounts it. The steps,
// and why, are in the package comment. When Create fails it removes what it
// made, dir included.
//
// dir must not exist or be an empty directory. Errors: ErrInvalidArgument
// for a bad size or path, ErrAlreadyExists when dir holds something.
func Create(dir, lower string, diskBytes int64, opts ...Option) (_ *Layer, err error) {
	size := diskBytes &^ (1<<20 - 1)
	if size < MinDiskBytes {
		return nil, errdefs.InvalidArgumentf("layer: disk size %d below the minimum %d", diskBytes, MinDiskBytes)
	}
	if st, err := os.Stat(lower); err != nil || !st.IsDir() {
		return nil, errdefs.InvalidArgumentf("layer: lower %s is not a directory", lower)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := checkOptionPath(dir); err != nil {
		return nil, err
	}
	if err := checkOptionPath(lower); err != nil {
		return nil, err
	}

	// 1. The directory.
	if err := os.Mkdir(dir, 0o711); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("layer %s: %w", dir, err)
		}
		ents, rerr := os.ReadDir(dir)
		if rerr != nil || len(ents) > 0 {
			return nil, errdefs.AlreadyExistsf("layer %s: directory exists and is not empty", dir)
		}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", dir, err)
	}
	defer func() {
		if err != nil && !errors.Is(err, errSimulatedCrash) {
			if derr := Destroy(real); derr != nil {
				err = fmt.Errorf("%w (and cleanup failed: %v)", err, derr)
			}
		}
	}()
	if err := hook("dir"); err != nil {
		return nil, err
	}
	l := &Layer{dir: real, lower: lower, diskBytes: size}

	// 2. The image.
	img, err := writeImage(l.image(), size)
	if err != nil {
		return nil, fmt.Errorf("layer %s: image: %w", dir, err)
	}
	defer img.Close()
	if err := hook("image"); err != nil {
		return nil, err
	}

	// 3 and 4. The loop device and the ext4 mount.
	if err := l.mountFS(img); err != nil {
		return nil, err
	}
	if err := hook("mount-fs"); err != nil {
		return nil, err
	}

	// 5. upper and work.
	if err := l.makeUpper(); err != nil {
		return nil, err
	}
	if err := hook("upper"); err != nil {
		return nil, err
	}

	// 6. The overlay.
	if err := os.Mkdir(l.Merged(), 0o755); err != nil {
		return nil, fmt.Errorf("layer %s: %w", dir, err)
	}
	if err := l.mountOverlay(lower); err != nil {
		return nil, err
	}
	if err := hook("overlay"); err != nil {
		return nil, err
	}

	// 7. The commit record.
	m := meta{Version: metaVersion, Lower: lower, DiskBytes: size, Created: time.Now().UTC()}
	if err := writeMeta(real, m); err != nil {
		return nil, fmt.Errorf("layer %s: %w", dir, err)
	}
	if err := hook("meta"); err != nil {
		return nil, err
	}
	return l, nil
}

// Open returns the layer in dir, mounting it again if it is not mounted
// (after a reboot, or after Unmount). Errors: ErrNotFound when dir holds no
// committed layer (absent, or half-created: Destroy it), ErrDataLoss when the
// image cannot be mounted.
func Open(dir string, opts ...Option) (*Layer, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.NotFoundf("layer %s", dir)
		}
		return nil, fmt.Errorf("layer %s: %w", dir, err)
	}
	m, err := readMeta(real)
	if err != nil {
		return nil, err
	}
	l := &Layer{dir: real, lower: m.Lower, diskBytes: m.DiskBytes}
	// A recorded handle belonged to the process that made the layer.
	l.handleUsed = isHandle(m.Lower)
	if o.lower != "" {
		if err := checkOptionPath(o.lower); err != nil {
			return nil, err
		}
		l.lower = o.lower
		l.handleUsed = false
	}
	if err := l.Mount(); err != nil {
		return nil, err
	}
	return l, nil
}

// Dir is the layer's directory.
func (l *Layer) Dir() string { return l.dir }

// Merged is the overlay: the root filesystem to give the runtime.
func (l *Layer) Merged() string { return filepath.Join(l.dir, mergedName) }

// Upper is the overlay's upper directory: what the sandbox changed relative
// to the template (whiteouts are 0/0 character devices). It is valid while
// the layer is mounted.
func (l *Layer) Upper() string { return filepath.Join(l.dir, fsName, upperName) }

// Lower is the template root filesystem the overlay is mounted on.
func (l *Layer) Lower() string { return l.lower }

// DiskBytes is the size of the layer's filesystem (the limit, as rounded).
func (l *Layer) DiskBytes() int64 { return l.diskBytes }

func (l *Layer) image() string { return filepath.Join(l.dir, imageName) }
func (l *Layer) fs() string    { return filepath.Join(l.dir, fsName) }

// Usage reports the bytes used and the usable bytes of the layer's
// filesystem (usable is DiskBytes less ext4's metadata, about 2%).
func (l *Layer) Usage() (used, usable int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.fs(), &st); err != nil {
		return 0, 0, fmt.Errorf("layer %s: statfs: %w", l.dir, err)
	}
	bs := int64(st.Bsize)
	return (int64(st.Blocks) - int64(st.Bfree)) * bs, int64(st.Blocks) * bs, nil
}

// Mount mounts the layer if it is not mounted: the ext4 image on DIR/fs
// (re-using a loop device still bound to the image, so that an image that is
// still mounted in another mount namespace is never mounted twice through
// two devices) and the overlay on DIR/merged. Mounting a mounted layer does
// nothing.
func (l *Layer) Mount() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	mounts, err := readMounts()
	if err != nil {
		return err
	}
	if isMounted(mounts, l.Merged()) {
		// Mounted already, perhaps by a daemon that did not set MountFlags.
		if err := hardenMount(l.fs()); err != nil {
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
		if err := hardenMount(l.Merged()); err != nil {
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
		return nil
	}
	if isHandle(l.lower) && l.handleUsed {
		return errdefs.FailedPreconditionf("layer %s: lower %s is a per-process handle, used already (its number may name another file now); Open with WithLower", l.dir, l.lower)
	}
	if !isMounted(mounts, l.fs()) {
		img, err := os.OpenFile(l.image(), os.O_RDWR, 0)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return errdefs.DataLossf("layer %s: image missing", l.dir)
			}
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
		err = l.mountFS(img)
		img.Close()
		if err != nil {
			return err
		}
	}
	return l.mountOverlay(l.lower)
}

// isHandle reports whether a lower path is a per-process handle such as
// /proc/self/fd/N (a detached, idmapped mount): valid only while the
// caller holds it, and only for one mount.
func isHandle(p string) bool { return strings.HasPrefix(p, "/proc/") }

// mountFS attaches img to a loop device (or re-uses the one it is bound to)
// and mounts it on DIR/fs.
func (l *Layer) mountFS(img *os.File) error {
	if err := os.Mkdir(l.fs(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	var dev *os.File
	if devs, _ := loopsBackedBy(l.image()); len(devs) > 0 {
		d, err := os.OpenFile(devs[0], os.O_RDWR, 0)
		if err == nil {
			dev = d
		}
	}
	if dev == nil {
		d, err := attachLoop(img)
		if err != nil {
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
		dev = d
	}
	// Closing dev after the mount leaves the mount as the device's only
	// opener (autoclear then frees it at unmount); closing it after a failed
	// mount frees it at once.
	defer dev.Close()
	if err := hook("loop"); err != nil {
		return err
	}
	// noinit_itable: never start ext4's lazy inode-table zeroing (see mkfsArgs).
	if err := unix.Mount(dev.Name(), l.fs(), "ext4", unix.MS_NOATIME|MountFlags, "noinit_itable"); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EUCLEAN) || errors.Is(err, unix.EIO) {
			return errdefs.DataLossf("layer %s: mount image: %v", l.dir, err)
		}
		return fmt.Errorf("layer %s: mount image on %s: %w", l.dir, dev.Name(), err)
	}
	return nil
}

// makeUpper creates upper and work on the freshly mounted image. The
// overlay's root directory takes its mode and owner from upper, so upper
// copies them from the template's root.
func (l *Layer) makeUpper() error {
	var st unix.Stat_t
	if err := unix.Stat(l.lower, &st); err != nil {
		return fmt.Errorf("layer %s: stat lower: %w", l.dir, err)
	}
	if err := os.Chmod(l.fs(), 0o700); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	up := l.Upper()
	if err := os.Mkdir(up, 0o700); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	if err := os.Chown(up, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	if err := os.Chmod(up, os.FileMode(st.Mode&0o777)|unixModeBits(st.Mode)); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	if err := os.Mkdir(filepath.Join(l.dir, fsName, workName), 0o700); err != nil {
		return fmt.Errorf("layer %s: %w", l.dir, err)
	}
	return nil
}

func unixModeBits(m uint32) os.FileMode {
	var fm os.FileMode
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

func (l *Layer) mountOverlay(lower string) error {
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off,metacopy=off",
		lower, l.Upper(), filepath.Join(l.dir, fsName, workName))
	if err := unix.Mount("overlay", l.Merged(), "overlay", MountFlags, data); err != nil {
		return fmt.Errorf("layer %s: mount overlay: %w", l.dir, err)
	}
	l.handleUsed = isHandle(lower)
	return nil
}

// Unmount unmounts the overlay and then the image (which frees the loop
// device). It fails with ErrFailedPrecondition while something still uses
// the overlay (a process whose root or cwd is inside it, an open file);
// the driver stops the sandbox first. Open or Mount mounts it again.
func (l *Layer) Unmount() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range []string{l.Merged(), l.fs()} {
		if _, err := unmount(p, false); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return errdefs.FailedPreconditionf("layer %s: %s is busy", l.dir, p)
			}
			return fmt.Errorf("layer %s: %w", l.dir, err)
		}
	}
	return nil
}

// Destroy removes the layer; see the package-level Destroy.
func (l *Layer) Destroy() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Destroy(l.dir)
}

// Destroy removes the layer in dir, whatever state it is in: committed,
// half-created, or already gone (then it returns nil). Order (package
// comment): unmount everything under dir, deepest first, detaching lazily
// what is busy; unbind loop devices backed by the image and wait for the
// kernel to release them; check that nothing is mounted under dir any more;
// remove dir. A loop device still held (a lazily detached mount whose last
// user has not gone) fails Destroy with ErrUnavailable and leaves dir in
// place, so that calling Destroy again later finishes the job.
func Destroy(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("layer %s: %w", dir, err)
	}
	if real == "/" {
		return errdefs.InvalidArgumentf("layer: refusing to destroy /")
	}
	for pass := 0; ; pass++ {
		mounts, err := readMounts()
		if err != nil {
			return err
		}
		under := mountsUnder(mounts, real)
		if len(under) == 0 {
			break
		}
		if pass >= 16 {
			return fmt.Errorf("layer %s: still mounted after %d passes: %s", dir, pass, strings.Join(under, " "))
		}
		for _, p := range under {
			if _, err := unmount(p, true); err != nil {
				return fmt.Errorf("layer %s: %w", dir, err)
			}
		}
	}
	if err := detachLoops(filepath.Join(real, imageName), loopReleaseWait); err != nil {
		return errdefs.Unavailablef("layer %s: %v", dir, err)
	}
	// Last check before a recursive delete: RemoveAll must never descend
	// into a mount (the template, or a host directory a runtime mounted).
	mounts, err := readMounts()
	if err != nil {
		return err
	}
	if under := mountsUnder(mounts, real); len(under) > 0 {
		return fmt.Errorf("layer %s: mounted again during destroy: %s", dir, strings.Join(under, " "))
	}
	if err := os.RemoveAll(real); err != nil {
		return fmt.Errorf("layer %s: %w", dir, err)
	}
	return nil
}

// checkOptionPath refuses paths that cannot be written into overlay mount
// options unambiguously (',' separates options, ':' lower layers, '\\'
// escapes). They are daemon-chosen paths, so refusing is enough.
func checkOptionPath(p string) error {
	if !filepath.IsAbs(p) {
		return errdefs.InvalidArgumentf("layer: path %q is not absolute", p)
	}
	if strings.ContainsAny(p, ",:\\\n") {
		return errdefs.InvalidArgumentf("layer: path %q contains a character not allowed in overlay options (, : \\ newline)", p)
	}
	return nil
}

func readMeta(dir string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, os.ErrNotExist) {
		return m, errdefs.NotFoundf("layer %s: no %s (absent or half-created; Destroy it)", dir, metaName)
	}
	if err != nil {
		return m, fmt.Errorf("layer %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, errdefs.DataLossf("layer %s: %s: %v", dir, metaName, err)
	}
	if m.Version != metaVersion {
		return m, errdefs.DataLossf("layer %s: %s has version %d, want %d", dir, metaName, m.Version, metaVersion)
	}
	return m, nil
}

// writeMeta writes the commit record durably: temp file, fsync, rename,
// fsync of the directory.
func writeMeta(dir string, m meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, metaName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, metaName)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// hook is a crash point for tests: testHook, when set, is called after each
// step of Create and may fail it. errSimulatedCrash additionally skips
// Create's own cleanup, leaving the half-created layer a crashed daemon
// would leave.
var testHook func(step string) error

var errSimulatedCrash = errors.New("simulated crash")

func hook(step string) error {
	if testHook == nil {
		return nil
	}
	return testHook(step)
}
