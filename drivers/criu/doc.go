// Package criu is Amber's second isolation driver: Linux namespaces and
// cgroup v1 through runc's libcontainer (used as a Go library, not the runc
// binary), prepared for checkpoint/restore with CRIU.
//
// # What a sandbox is here
//
// Each sandbox is one libcontainer container whose init is amber-agent
// (cmd/amber-agent, protocol lib/agentproto; agent.go here). Its root
// filesystem is an drivers/internal/layer overlay: the template's rootfs, seen
// through an idmapped mount, under a per-sandbox writable layer with a size
// limit (an ext4 image on a loop device).
//
// # The agent
//
// The agent is the container's init (PID 1 of its PID namespace, sandbox
// root): it reaps orphans, and every process Exec and Start run is its
// child, started by it inside the sandbox — libcontainer's exec is not used
// for them. So whatever a plain Exec leaves running (`nohup server &`, a
// daemon that double-forks) is in the sandbox's tree, part of every
// checkpoint, and back with its PID after a restore. Its binary is
// independent of the template: New adds Options.AgentBinary (or
// agent.FindBinary's) to an agent store, <StateDir>/agents, by digest (the
// build id), and each sandbox binds its build read-only, nosuid, nodev at
// agentproto.Path inside /dev's tmpfs — the mount point is a file of that
// tmpfs, never of the writable layer. The bind's source is a copy under
// <RunDir>/.agents/<digest>/ (0711 directories, a 0555 file of host root):
// CRIU opens it from inside the sandbox's user namespace at restore, where
// the private state directory cannot be searched.
//
// The daemon talks to the agent over HTTP/2 on 127.0.0.1:agentproto.Port
// of the sandbox's own network namespace, connections made with DialPort;
// one agent.Client per sandbox, cached in the driver. Each request carries
// the sandbox's agent token, drawn at Create, kept in the record (0600) and
// in the checkpoint's image.json, and given to the agent in its
// environment, so a non-root template user cannot ask the agent (root) to
// start something as root. Create returns once the agent answers, running
// the build the record names. Exec streams the command's output over the
// connection; Start's processes also log to /run/amber/proc/<pid>.log and
// <pid>.exit (procwait's files); Output (sandbox.OutputReader) re-attaches
// to a process's output ring by offset; Signal and Wait go through the
// agent; Processes still reads the host's /proc (so a restored process
// keeps its start time) and leaves the agent out.
//
// Sandboxes made before the agent (record.Init empty), and those restored
// from their checkpoints, keep the old init — the template's /bin/sh
// sleeping in a loop and reaping orphans — and run commands with
// libcontainer's exec (setns), as before.
//
// # Hardening, and why
//
// The host kernel is shared with the sandbox, so the driver stacks the
// usual container defences and removes what it can of the kernel's attack
// surface:
//
//   - User namespace. Sandbox root is an unprivileged host uid: each sandbox
//     gets its own 65536-id range (Options.UIDBase + n·65536), so a process
//     that escapes its other namespaces is still nobody on the host and
//     cannot touch another sandbox's files or processes. The template, owned
//     by host root, is shown to the sandbox through an idmapped mount so its
//     files appear owned by sandbox root without copying or chowning it.
//   - PID, mount, IPC, UTS, cgroup and time namespaces; a network namespace
//     of its own. Without Options.Network it holds only loopback (no route
//     anywhere: nothing on the host, another sandbox or link-local is
//     reachable). With it (the node's egress gateway) it also has eth0, a
//     veth to the sandbox's gateway namespace, and a default route through
//     it: the gateway, which applies the sandbox's egress policy, is the
//     only thing it reaches (network.go; internal/egress).
//   - Capabilities reduced to a small set (see defaultCaps): no
//     CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_PTRACE, CAP_MKNOD,
//     CAP_SYS_MODULE, ...; all of them only ever apply inside the user
//     namespace anyway. no_new_privs is set, so setuid binaries and file
//     capabilities cannot raise them again.
//   - A seccomp filter (see defaultSeccomp) that denies the system calls
//     which reach kernel code a sandbox has no business using and which
//     have a history of privilege escalations: keyrings, bpf,
//     perf_event_open, userfaultfd, io_uring, kernel modules, kexec, every
//     mount API, pivot_root, setns, clock setting, and creating new user
//     namespaces (unshare/clone with CLONE_NEWUSER; clone3 answers ENOSYS so
//     libc falls back to clone, whose flags the filter can inspect). Sockets
//     of family AF_VSOCK are refused: vsock is not network-namespaced and
//     reaches the hypervisor's services on Firecracker hosts.
//   - Mounts: only proc, sysfs (read-only), a tmpfs /dev with the standard
//     device nodes, devpts, /dev/shm and mqueue. No host directory is
//     mounted in. runc's masked paths (/proc/kcore, /proc/keys,
//     /proc/sched_debug, /sys/firmware, ...) are hidden and its read-only
//     paths (/proc/sys, /proc/sysrq-trigger, /proc/irq, ...) are remounted
//     read-only. Device access is denied by the devices cgroup except the
//     standard set (null, zero, full, random, urandom, tty, ptmx/pts).
//   - cgroup v1 limits per sandbox (memory without swap, CPU quota, pids)
//     under Options.CgroupParent/<id>, and the layer's size for disk; the
//     sandbox's processes get a raised oom_score_adj so the host's own
//     processes are not the kernel's first choice when the whole machine
//     runs short. RLIMIT_CORE is 0: a core_pattern that pipes to a program
//     would run it on the host, as root.
//
// None of this makes a shared kernel safe against a kernel bug reachable
// through the allowed system calls: the gvisor driver is the one fit for
// untrusted multi-tenant code. See docs/security.md.
//
// # Re-exec init
//
// libcontainer starts every container process by re-executing the current
// binary as "<argv0> init" (its nsexec C constructor, linked in through
// libcontainer/nsenter, sets up namespaces before the Go runtime starts).
// A program that uses this driver must therefore call InitIfRequested as
// the first statement of main (and a test binary in TestMain). It returns
// at once in a normal run. Every container start (and every exec of a
// sandbox without the agent) pays for the binary's start (Go runtime and
// package init functions).
//
// Importing the package also locks the main goroutine to the main thread
// (an init function): libcontainer leaves a thread it moved into a
// container's mount namespace to die with its goroutine, which the runtime
// cannot do to the main thread (see init.go).
//
// The cgo part (nsenter) and the seccomp filter (libseccomp, build tag
// "seccomp") require building with CGO_ENABLED=1 and -tags seccomp, with
// libseccomp-dev installed. A binary built without the tag refuses to create
// sandboxes (Check says why) rather than run them unfiltered.
//
// # Checkpoint/restore
//
// Driver implements sandbox.Checkpointer (checkpoint.go) with libcontainer's
// Checkpoint and Restore, which drive CRIU against the same container,
// rootfs and cgroups this driver sets up. The cut: the driver freezes the
// sandbox's freezer cgroup, archives the layer's upper directory
// (layer.tar; a file of 1 MiB or more as a blob in layer-blobs/, linked
// from the sandbox's blob cache, blobCacheDir, when it did not change
// since the last cut), lets CRIU dump the frozen tree (leave-running; CRIU keeps a
// cgroup it found frozen frozen), then thaws it, or kills it for
// LeaveStopped. Restore rebuilds layer and container from the template and
// the image, in this or a fresh state directory: under the image's own
// sandbox id into the same uid range as at the cut; a fork (another id)
// into a free range, from a private copy of the images whose user
// namespace maps are moved to it (fork.go), so it runs beside the
// original. What this host needs:
//   - libcontainer runs "criu" from PATH: the driver puts the directory of
//     Options.CriuPath first in PATH when another criu would be found.
//   - CRIU locks the network with nftables (libnftables, in CRIU's
//     process; `network-lock nftables` in the driver's CRIU config file,
//     which the patched CRIU reads in RPC mode: libcontainer's CriuOpts
//     cannot pass it); images of the iptables lock restore with it
//     (Debian's iptables package). The lock is needed at the restore: a
//     loopback connection whose one end is restored before the other
//     would be reset (`network-lock skip` failed the kernel-objects
//     suite's tcpfull case so).
//   - CRIU dumps the network namespace empty (--empty-ns net) and the
//     driver makes it again at the restore, from what image.json records
//     (netnsimage.go): no `ip`/iptables process in a cut or a restore.
//   - CRIU reads the sandbox's cgroups through the host's own mounts
//     (`cgroup-yard /sys/fs/cgroup` where the layout fits, hostCgroupYard)
//     instead of mounting every hierarchy itself at each dump, and the
//     patched CRIU keeps its kernel-feature cache in /run though /run is
//     not a tmpfs here (scripts/setup/criu-4.1.1-kdat-cache.patch): a cut
//     no longer probes the kernel.
//   - restored tasks read some images inside the user namespace before its
//     uid map is written, so the images are made readable by all (their
//     directory stays private to root; CRIU reaches them through a
//     descriptor).
//   - the kernel gives a restored process the restore's start time; the
//     driver records each process's start time in the image and reports the
//     original one from Processes (record.Restored).
//   - egress (Options.Network): CRIU cannot restore the sandbox's veth
//     (from inside the restored user namespace it may not put the peer in
//     the host's namespace), so a checkpoint deletes the veth while the
//     sandbox is frozen, before the dump, with the sandbox's address kept
//     on loopback and the default route through loopback (CRIU binds and
//     connects the restored sockets back with them), and plumbs it again
//     before the thaw; a restore plumbs the restored namespace. A restore
//     in place keeps the gateway namespace of the sandbox it replaces, so
//     a connection to the outside survives a planned move; after a crash
//     the restored end gets a reset (network.go).
//   - the agent: image.json names its build, and the restore binds that
//     very build from the agent store (the restored process has it mapped);
//     a node without it refuses the restore (FailedPrecondition). Before
//     the cut the driver holds new dials to the agent and drops the
//     client's connections, and waits until the agent's ends are closed,
//     so no connection of the daemon's is in the image; streams re-attach
//     by offset once the sandbox thaws (or is restored). CRIU dumps an
//     open connection too (TcpEstablished; tested), but a restored agent
//     would keep a half of it whose peer is gone. The agent's listener
//     must be plain TCP: CRIU cannot dump MPTCP, which Go's net.Listen
//     uses by default (the agent turns it off on its listener).
//   - lazy restore (`criu lazy-pages` sharing the restore's work directory,
//     fs.pipe-max-size >= 4 MiB): the restored tasks create their
//     userfaultfd inside the user namespace, where userfaultfd(2) is EPERM
//     while vm.unprivileged_userfaultfd=0 (it stays 0: a host-wide
//     relaxation). The patched CRIU (criu-4.1.1-uffd-dev.patch) creates it
//     with USERFAULTFD_IOC_NEW on the root-only /dev/userfaultfd (Linux >=
//     6.1; permission is checked at open only), which `criu lazy-pages`,
//     root and outside the sandbox's cgroups, opens and hands to the
//     restore over its socket in the root-only work directory (the
//     restoring CRIU is already in the sandbox's devices cgroup, which
//     denies the device). Each restored task closes it before restored
//     code runs (TestCheckpointLazy checks no sandbox process holds it).
//     Capabilities().LazyRestore reports whether this works here (`criu
//     check --feature uffd-dev`) or the sysctl is 1.
//
// # State
//
// The driver keeps its state under Options.StateDir and one mount point per
// sandbox under Options.RunDir:
//
//	<StateDir>/runc/<id>/            libcontainer's state (state.json)
//	<StateDir>/agents/<digest>/      agent builds (agent.Store)
//	<StateDir>/slots/<n>             claim of uid range n (holds the id)
//	<StateDir>/sandboxes/<id>/       sandbox.json (this driver's record) and
//	                                 the writable layer (drivers/internal/layer)
//	<RunDir>/<id>                    bind mount of the layer's merged root:
//	                                 the container's rootfs
//	<RunDir>/.agents/<digest>/       the copy of an agent build sandboxes bind
//
// StateDir is private to root; RunDir is searchable (not listable) by
// others, because sandbox root, an unprivileged host uid, must walk to its
// rootfs.
//
// After a daemon restart List and Inspect load both; mounts and cgroups
// outlive the daemon, so running sandboxes are found running. Destroy
// removes each piece independently, so it succeeds on a half-created
// sandbox and when repeated.
package criu
