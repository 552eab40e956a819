// Command probe runs inside a sandbox (built statically by the criu driver's
// tests) and prints, for each system call the sandbox's seccomp filter
// should refuse, "name errno" — or "name ok" when the call got through.
package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func report(name string, err error) {
	if err == nil {
		fmt.Println(name, "ok")
		return
	}
	if errno, ok := err.(syscall.Errno); ok {
		fmt.Println(name, unix.ErrnoName(errno))
		return
	}
	fmt.Println(name, err)
}

func raw(trap uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

func main() {
	// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)
	report("keyctl", raw(unix.SYS_KEYCTL, 0, uintptr(0xfffffffd), 0))
	desc := []byte("amber\x00")
	typ := []byte("user\x00")
	report("add_key", raw(unix.SYS_ADD_KEY, uintptr(unsafe.Pointer(&typ[0])), uintptr(unsafe.Pointer(&desc[0])), 0, 0, uintptr(0xfffffffd)))
	report("bpf", raw(unix.SYS_BPF, 0, 0, 0))
	var attr unix.PerfEventAttr
	attr.Type = unix.PERF_TYPE_SOFTWARE
	attr.Size = uint32(unsafe.Sizeof(attr))
	attr.Config = unix.PERF_COUNT_SW_CPU_CLOCK
	_, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
	report("perf_event_open", err)
	report("userfaultfd", raw(unix.SYS_USERFAULTFD, 0))
	report("io_uring_setup", raw(unix.SYS_IO_URING_SETUP, 1, 0))
	report("unshare_user", unix.Unshare(unix.CLONE_NEWUSER))
	report("clone3", raw(unix.SYS_CLONE3, 0, 0))
	report("mount", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	report("setns", raw(unix.SYS_SETNS, 0, 0))
	_, err = unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	report("socket_vsock", err)
	report("kexec_load", raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0))
	report("init_module", raw(unix.SYS_INIT_MODULE, 0, 0, 0))
	// Allowed calls, as a control: these must work.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.Close(fd)
	}
	report("socket_inet", err)
	report("getpid", nil)
	os.Exit(0)
}
