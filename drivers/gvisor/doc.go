// Package gvisor is Amber's default isolation driver: every sandbox is a
// gVisor sandbox run by runsc (the OCI runtime), so the tenant's code talks
// to gVisor's user-space kernel, never to the host's.
//
// # A sandbox, concretely
//
// Create writes an OCI bundle (config.json made here from
// runtime-spec's Go types) whose root is the writable layer's merged
// directory (drivers/internal/layer: an overlay of a size-bounded ext4 image on the
// template, which stays read-only and shared), pins a fresh network
// namespace, and runs `runsc run --detach`. The init (PID 1) is amber-agent
// (cmd/amber-agent, protocol in lib/agentproto), bound read-only at
// /dev/.amber-agent (in /dev's tmpfs, not in the layer) from the driver's
// agent store, and run as the sandbox's root with a random per-sandbox
// token in its environment; Create returns once it answers. Everything
// that runs inside is the agent's child, started over one HTTP/2
// connection that the driver's port dialer opens to the agent's port on
// the sandbox's loopback (agent.go): Exec streams the command's output
// (stdin, TTY); Start also writes procwait's log and exit files
// (/run/amber/proc/<pid>.log, .exit) and keeps the output in a ring that
// Output re-attaches to by byte offset; Wait, Processes (the agent left
// out) and Signal are agent calls. No `runsc exec` runs for any of them,
// so every process a command leaves behind (`nohup server &`, a daemon's
// double fork) is in the init's tree and comes back with a restore. Kill
// is `runsc kill --all KILL` (a sandbox left paused by a dead daemon's cut
// ignores it and has its host processes killed: leftover.go); Destroy is `runsc delete --force` and the
// removal of everything below.
//
// Sandboxes (and checkpoints) made before the agent — spec generations 0
// and 1, see specVersion — keep what they were made with: the template's
// /bin/sh as the init, sleeping in a loop and reaping orphans; Exec is one
// `runsc exec` per command; Start asks the init to start the process under
// a waiter that records its exit status in the layer (a runsc exec'd
// process does not survive a restore); Wait reads that status on the host
// (drivers/internal/procwait); Processes reads /proc with an exec; Signal
// is `runsc kill --pid`. They have no output ring.
//
// # runsc flags, and why
//
// Every runsc call gets --root=<StateDir>/runsc-root and the runtime flags
// (runtimeFlags, recorded per sandbox so that a restore uses the same):
//
//	--platform=systrap    seccomp-trap platform: needs no KVM (this host's
//	                      KVM is PVM); the platform the pinned runsc is
//	                      verified with here
//	--network=sandbox     gVisor's own network stack (netstack) in the
//	                      sandbox; it copies the interfaces and routes of the
//	                      network namespace it starts in
//	--overlay2=none       no overlay inside gVisor: writes go through the
//	                      gofer to the host directory, i.e. into our layer,
//	                      where Files, the disk limit and a checkpoint of the
//	                      layer see them. The default (root:self) would keep
//	                      the writable layer in a file store or in the
//	                      sandbox's memory, invisible from the host.
//	--file-access=shared  the sentry revalidates cached dentries and file
//	                      attributes against the host on every access, so a
//	                      file that Files (or anything on the host) writes,
//	                      replaces or removes is what the next access inside
//	                      sees. With the default (exclusive) the sandbox
//	                      assumes it owns the tree: measured here, a file
//	                      the host removed was still listed and readable
//	                      inside. The cost is a revalidation per lookup.
//	--host-uds=none, --host-fifo=none
//	                      the sandbox cannot open host sockets or FIFOs that
//	                      appear in its tree (the defaults, made explicit).
//
// AMBER_GVISOR_RUNSC_FLAGS (RunscFlagsEnv, flags.go), read by New, replaces
// --platform, --overlay2 or --file-access, or adds --directfs, for the
// sandboxes that driver creates: a way to measure runsc's options on a
// real workload (make bench-restore's sqlite-gvisor+… stacks) and to run
// the test suites with one. An overlay inside gVisor breaks the promises
// above (the layer on the host no longer holds the sandbox's writes), so
// it is an experiment, not a setting; docs/benchmarks.md ("The sandbox's
// own speed") has the figures.
//
// # Network
//
// Each sandbox starts in its own network namespace, made by createNetns and
// bind-mounted at <StateDir>/netns/<id>: loopback only, up, and no route.
// netstack copies that: the sandbox has 127.0.0.1 and ::1 and nothing else,
// so it reaches neither the host's services (the host's loopback is not the
// sandbox's), nor another sandbox, nor link-local or metadata addresses.
// The egress gateway (a later issue) adds an interface to this namespace
// before the sandbox boots; a restore boots in the same namespace.
//
// # File descriptors
//
// Nothing of the daemon's reaches a sandbox. The init's stdio is /dev/null
// (a host file or pipe there would stay reachable through /proc/1/fd for
// the sandbox's life). A process the agent starts has pipes (or a
// pseudo-terminal) the agent made inside the sandbox; what crosses to the
// host is bytes over the agent's connection, a Unix socket of the daemon's
// that runsc hands to the sentry (portdial.go). In a sandbox of the sh
// init's generations, an exec's stdio are pipes that os/exec creates (the
// caller's readers and writers are wrapped so that os/exec cannot hand an
// *os.File through) or, in TTY mode, the replica of a pseudo-terminal
// opened here; runsc exec is started with no ExtraFiles and with every
// other descriptor close-on-exec, and donates exactly its fds 0-2. runsc's
// own error messages go to a per-call --log file, not to the command's
// streams.
//
// # Limits
//
// Memory, CPU and pids are cgroup v1 limits on <CgroupParent>/<id> (set by
// runsc from config.json's linux.resources); the memory limit covers
// everything the sandbox costs the host, gVisor's kernel included (about
// 20 MiB idle). Processes inside are limited by RLIMIT_NPROC = Limits.Pids
// (gVisor enforces it; a fork bomb gets EAGAIN and the sandbox lives on);
// the host pids cgroup is a backstop set well above it (hostPidsLimit).
// Disk is the layer's image size.
//
// A sandbox that exceeds its memory limit is stopped as a whole: the
// kernel's OOM killer picks one of its host processes (the gVisor kernel
// or a systrap stub), and gVisor cannot survive losing either. The
// contract allows this (the hog is killed, the host and other sandboxes
// are untouched); the exec that was running returns ErrResourceExhausted,
// Inspect reports the sandbox stopped with its files kept, and the engine
// can restore it from a checkpoint. gVisor has no memory accounting of its
// own that would let it kill only the hog.
//
// # State
//
// Everything is under Options.StateDir:
//
//	<StateDir>/runsc-root/            runsc's state (--root)
//	<StateDir>/agents/<hex>/amber-agent
//	                                  agent builds by digest (agent.Store),
//	                                  every build a sandbox or image may name
//	<StateDir>/netns/<id>             the sandbox's pinned network namespace
//	<StateDir>/sandboxes/<id>/
//	    sandbox.json                  this driver's record (versioned; 0600:
//	                                  it holds the agent's token)
//	    bundle/config.json            the OCI spec
//	    layer/                        drivers/internal/layer: disk.img, fs/, merged/
//	    layer-cache/                  the layer's blob cache: the large files
//	                                  the last cut saw (drivers/internal/layer,
//	                                  blobs.go), linked into the next image
//	    exec/                         per-exec process specs and pid files
//	    runsc.log                     runsc's errors while booting
//
// After a daemon restart, List and Inspect read the records and ask runsc
// (one `runsc list`): a sandbox still running is found running; one whose
// processes died is stopped. Destroy works from the id alone, step by step
// (runtime, leftover processes in the cgroup, runsc state, network
// namespace, layer, cgroups, directory), so it also removes a half-created
// sandbox and is idempotent.
//
// # Checkpoint and restore
//
// Checkpoint (checkpoint.go) cuts the sandbox into an image directory:
// `runsc pause`; the layer's upper directory archived to layer.tar (modes,
// owners, times, symlinks, hard links, whiteouts, xattrs; a file of 1 MiB
// or more as a blob in layer-blobs/, linked from the sandbox's blob cache
// when it did not change since the last cut, else copied once); `runsc
// checkpoint --compression=none --leave-running` into runsc/; `runsc
// resume`; image.json (format version, runsc version and flags, template,
// limits, environment, spec generation, agent build and token; 0600). No
// connection to the agent may be open at the cut: gVisor cannot save the
// sentry's port-forward proxy (its waiter entries), and runsc checkpoint
// fails. Checkpoint therefore holds new agent dials, closes the agent's
// connections, cuts, resumes and lets the dials through; a stream that
// was flowing (Exec output, Output, Wait) re-attaches from the last offset
// it delivered, with no gap and no repeat. Restore deletes the runtime container of a stopped
// sandbox (or creates the layer from the template on a state directory
// that never saw it), replaces the upper directory's content from
// layer.tar with the overlay unmounted, remakes the network namespace and
// the bundle with the image's flags, and runs `runsc restore --detach`
// (with --background when the restore is lazy: lazy.go). It
// refuses an image of another runsc version or template version, and
// (ErrFailedPrecondition, before it touches anything) one whose agent
// build is not in this node's store: the restored init maps that very
// binary. RuntimeBuild names the runsc build and the agent build.
//
// gVisor's restore SIGKILLs every process descended from a `runsc exec`
// (its caller is gone). With the agent as the init nothing descends from
// one: every process, plain Execs included, is restored, and a command
// that was running under Exec at the cut is back too (its output is in
// the agent's ring; a client re-attaches by offset). In a sandbox of the
// sh init's generations, background processes are children of the init
// (Start hands them to it) and survive; what an Exec started does not. /tmp is a directory of the layer
// rather than a tmpfs whose presence would have to match at restore.
// Outside TCP connections do not survive a runsc restore
// (Capabilities.LiveOutsideTCP is false).
package gvisor
