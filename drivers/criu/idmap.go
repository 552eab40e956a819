package criu

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// usernsFD returns an open file of a fresh user namespace mapping ids
// 0..size-1 to base..base+size-1, for mount_setattr(MOUNT_ATTR_IDMAP). The
// namespace is created by a short-lived helper (this binary in its
// usernsHoldArg role), which exits once the namespace file is open.
func usernsFD(base, size int) (*os.File, error) {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	cmd := exec.Command(self, usernsHoldArg)
	cmd.Env = []string{usernsHoldEnv + "=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
		Pdeathsig:   syscall.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start userns helper: %w", err)
	}
	// The maps are written before the child execs, so the namespace is
	// complete as soon as Start returns.
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	_ = stdin.Close()
	if werr := cmd.Wait(); werr != nil && err == nil {
		// The namespace is still valid, but say why the helper failed: it
		// usually means InitIfRequested is not called first in main.
		f.Close()
		return nil, fmt.Errorf("userns helper %s %s: %w (does main call criu.InitIfRequested first?)", self, usernsHoldArg, werr)
	}
	if err != nil {
		return nil, fmt.Errorf("open userns: %w", err)
	}
	return f, nil
}

// idmappedTree returns a detached, read-only, idmapped clone of the mount
// tree at src: files owned by host uid u appear owned by base+u. The caller
// uses it (as /proc/self/fd/N) as an overlay lower layer and closes it
// afterwards; the overlay keeps its own reference.
func idmappedTree(src string, userns *os.File) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, fmt.Errorf("open_tree %s: %w", src, err)
	}
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("idmap %s (kernel >= 5.12 and a filesystem that supports idmapped mounts needed): %w", src, err)
	}
	return os.NewFile(uintptr(fd), "idmapped:"+src), nil
}
