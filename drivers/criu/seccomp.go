package criu

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/opencontainers/runc/libcontainer/configs"
)

// deniedSyscalls fail with EPERM inside a sandbox. The filter allows
// everything else (a deny list, like the kernel-surface part of Docker's
// profile, rather than Docker's full allow list: agents run arbitrary
// toolchains, and an allow list that misses a new syscall breaks them in
// ways that are hard to see). Each group is here because it reaches kernel
// code that is not namespaced or has a record of privilege escalations,
// and a sandbox does not need it:
var deniedSyscalls = []string{
	// Kernel keyrings are global, not namespaced.
	"keyctl", "add_key", "request_key",
	// eBPF and perf: large, often-exploited attack surface; leak host info.
	"bpf", "perf_event_open",
	// userfaultfd stalls the kernel at chosen points (exploit primitive);
	// io_uring has had a long run of privilege escalations.
	"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	// Kernel modules and replacing the kernel.
	"init_module", "finit_module", "delete_module", "create_module",
	"kexec_load", "kexec_file_load", "reboot",
	// Every mount API and namespace switching: the sandbox's mount table is
	// fixed at creation.
	"mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount",
	"open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "setns",
	// Host-wide clocks, accounting, swap, quotas, kernel log. (adjtimex
	// and clock_adjtime stay: they read clock state, and changing it
	// needs CAP_SYS_TIME, which sandboxes lack.)
	"settimeofday", "stime", "clock_settime",
	"acct", "swapon", "swapoff", "quotactl", "quotactl_fd", "syslog",
	// File handles bypass path-based confinement ("shocker").
	"open_by_handle_at",
	// Obsolete or hardware-level calls.
	"uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "lookup_dcookie",
	"ioperm", "iopl", "vm86", "vm86old", "get_kernel_syms", "query_module",
	"fanotify_init", "lsm_set_self_attr",
}

// defaultSeccomp is the filter every sandbox process runs under: the deny
// list above, plus
//   - unshare and clone with CLONE_NEWUSER fail (EPERM): a new user
//     namespace would give its creator every capability over fresh
//     namespaces and expose the kernel code behind them;
//   - clone3 fails with ENOSYS: its flags sit in memory the filter cannot
//     read, and libc falls back to clone on ENOSYS;
//   - socket(AF_VSOCK) fails (EPERM): vsock is not network-namespaced and
//     reaches the hypervisor's and host agent's services.
func defaultSeccomp() *configs.Seccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	s := &configs.Seccomp{
		DefaultAction: configs.Allow,
		Architectures: seccompArches(),
	}
	for _, name := range deniedSyscalls {
		s.Syscalls = append(s.Syscalls, &configs.Syscall{Name: name, Action: configs.Errno, ErrnoRet: &eperm})
	}
	newuser := &configs.Arg{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: unix.CLONE_NEWUSER, Op: configs.MaskEqualTo}
	s.Syscalls = append(s.Syscalls,
		&configs.Syscall{Name: "unshare", Action: configs.Errno, ErrnoRet: &eperm, Args: []*configs.Arg{newuser}},
		// clone's flags are argument 0 on x86 and arm64 alike.
		&configs.Syscall{Name: "clone", Action: configs.Errno, ErrnoRet: &eperm, Args: []*configs.Arg{newuser}},
		&configs.Syscall{Name: "clone3", Action: configs.Errno, ErrnoRet: &enosys},
		&configs.Syscall{Name: "socket", Action: configs.Errno, ErrnoRet: &eperm,
			Args: []*configs.Arg{{Index: 0, Value: unix.AF_VSOCK, Op: configs.EqualTo}}},
		&configs.Syscall{Name: "socketpair", Action: configs.Errno, ErrnoRet: &eperm,
			Args: []*configs.Arg{{Index: 0, Value: unix.AF_VSOCK, Op: configs.EqualTo}}},
	)
	return s
}

// seccompArches lists the ABIs a process can call the kernel through on
// this machine, so that a 32-bit syscall cannot bypass the list.
func seccompArches() []string {
	switch runtime.GOARCH {
	case "amd64":
		return []string{"amd64", "x86", "x32"}
	case "arm64":
		return []string{"arm64", "arm"}
	}
	return nil
}
