package criu

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// usernsFD returns an open file of a fresh user namespace mapping ids
// 0..size-1 to base..base+size-1, for mount_setattr(MOUNT_ATTR_IDMAP).
//
// The namespace needs a process to be created in: a child cloned with
// CLONE_NEWUSER that execs this binary under PTRACE_TRACEME, so the kernel
// stops it right after execve, before any of its code (dynamic loader
// included) runs. The maps are written while it waits; its namespace file
// is opened, and it is killed. This costs a fork and an execve, not a
// program start.
func usernsFD(base, size int) (*os.File, error) {
	// ptrace ties the tracee to this thread, which also waits for it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := &syscall.ProcAttr{
		Env: []string{},
		Sys: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
			Ptrace:      true,
			Pdeathsig:   syscall.SIGKILL,
		},
	}
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"amber-criu-userns"}, attr)
	if err != nil {
		return nil, fmt.Errorf("userns helper: %w", err)
	}
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if err != unix.EINTR {
				return
			}
		}
	}()
	var ws unix.WaitStatus
	for {
		_, err = unix.Wait4(pid, &ws, 0, nil)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || !ws.Stopped() {
		return nil, fmt.Errorf("userns helper did not stop after exec (status %v): %v", ws, err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
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
