package gvisor

import (
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/drivers/internal/procwait"
	"github.com/amber-run/amber/lib/agentproto"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ociVersion is the runtime-spec version runsc implements.
const ociVersion = "1.2.1"

// initScript is the sandbox's init (PID 1): a shell that makes the
// background-process log directory and then sleeps forever. Waiting for a
// child makes the shell wait for any child (wait4(-1)), so orphans
// re-parented to PID 1 are reaped as they exit. TERM is trapped so that
// only an explicit KILL ends the sandbox. USR1 (trapped, so that it
// interrupts the wait builtin) makes it start the scripts Start left in
// spawnDir (see Start); the work is done in the loop, not in the trap, so
// a signal arriving meanwhile cannot interrupt it.
const initScript = `trap : TERM INT HUP USR1; mkdir -p ` + procLogDir + ` ` + spawnDir + `; ` +
	`while :; do ` +
	`for f in ` + spawnDir + `/*.req; do [ -e "$f" ] || continue; r=${f%.req}; mv "$f" "$r.run" || continue; c=$(cat "$r.run"); rm -f "$r.run"; /bin/sh -c "$c" amber-proc & echo $! > "$r.tmp"; mv "$r.tmp" "$r.pid"; done; ` +
	`sleep 3600 & s=$!; wait $s; kill -9 $s 2>/dev/null; done`

// spawnDir is where Start leaves scripts for the init to run: in the
// sandbox's /dev tmpfs (memory, saved with a checkpoint).
const spawnDir = "/dev/.amber-spawn"

// procLogDir holds the output of background processes, <pid>.log, and
// their exit statuses, <pid>.exit (see drivers/internal/procwait).
const procLogDir = procwait.Dir

// defaultCaps is the capability set of sandbox processes (bounding,
// effective, permitted): the criu driver's, which is Docker's default less
// CAP_NET_RAW, CAP_MKNOD, CAP_SETFCAP, CAP_SYS_CHROOT and CAP_AUDIT_WRITE.
// These capabilities act on gVisor's kernel, not the host's. Leaving out
// CAP_SYS_ADMIN and CAP_SYS_RESOURCE matters here for another reason too:
// gVisor exempts tasks holding either from RLIMIT_NPROC, which is how the
// pids limit is enforced inside the sandbox (see pidsHostHeadroom).
var defaultCaps = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
}

// oomScoreAdj makes the sandbox's host processes the kernel's preferred
// victims when the whole host runs out of memory (each sandbox's own limit
// is enforced by its memory cgroup first).
const oomScoreAdj = 500

// pidsHostHeadroom: the pids limit is enforced twice. Inside the sandbox,
// RLIMIT_NPROC = Limits.Pids makes fork fail with EAGAIN, and the sandbox
// keeps working. On the host, the sandbox's pids cgroup bounds the host
// tasks of the gVisor kernel (its Go threads, and roughly two host tasks
// per sandbox process for the systrap stubs). Hitting the host limit kills
// the whole sandbox (the Go runtime cannot start a thread), so it is set
// well above what Limits.Pids sandbox processes need: it is only a
// backstop.
func hostPidsLimit(pids int64) int64 { return 4*pids + 256 }

// cpuPeriod is the CFS period; the quota is MilliCPUs·period/1000.
const cpuPeriod = 100000

// parseUser reads a template's "uid:gid" (numeric; empty means 0:0).
func parseUser(s string) (uid, gid uint32, err error) {
	if s == "" {
		return 0, 0, nil
	}
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		g = u
	}
	uu, err1 := strconv.ParseUint(u, 10, 32)
	gg, err2 := strconv.ParseUint(g, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, errdefs.InvalidArgumentf("template user %q: want numeric \"uid:gid\"", s)
	}
	return uint32(uu), uint32(gg), nil
}

// mergeEnv returns a default PATH and HOME, then each list in order; the
// last value of each name wins and keeps the position of its first one.
func mergeEnv(uid uint32, lists ...[]string) []string {
	home := "/root"
	if uid != 0 {
		home = "/"
	}
	env := []string{"PATH=" + defaultPath, "HOME=" + home}
	for _, l := range lists {
		env = append(env, l...)
	}
	seen := map[string]int{}
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			out[i] = kv
			continue
		}
		seen[name] = len(out)
		out = append(out, kv)
	}
	return out
}

// caps returns the capability sets of sandbox processes.
func caps() *specs.LinuxCapabilities {
	c := func() []string { return append([]string(nil), defaultCaps...) }
	return &specs.LinuxCapabilities{Bounding: c(), Effective: c(), Permitted: c()}
}

// rlimits are the resource limits of every sandbox process (runsc applies
// the root spec's rlimits to exec'd processes too).
func rlimits(rec *record) []specs.POSIXRlimit {
	n := uint64(rec.Limits.Pids)
	return []specs.POSIXRlimit{
		{Type: "RLIMIT_NPROC", Hard: n, Soft: n},
		{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20},
	}
}

// specVersion is the generation of ociSpec that Create gives a sandbox
// (record.SpecVersion; its checkpoints carry it in image.json). runsc
// restore refuses a spec that differs from the checkpointed one in
// anything but mount sources, paths, environment, hostname and resources,
// so a sandbox keeps the generation it was created with, through every
// checkpoint and restore:
//
//	0  before NoNewPrivileges: /tmp bound "rbind,rw"
//	1  NoNewPrivileges on the init (and so on everything it starts);
//	   /tmp bound "rbind,rw,nosuid,nodev"
//	2  the init is amber-agent (agentproto.Path, bound read-only from the
//	   driver's agent store), run as the sandbox's root with the
//	   sandbox's agent token in its environment; Exec, Start, Signal,
//	   Processes and Wait go through it (agent.go)
//
// Every generation takes the /tmp bind's source from a mount the driver
// makes by descriptor (see mountSource), never from a path inside the
// layer. Generations 0 and 1 keep the sh init and the runsc exec paths:
// their checkpoints restore, and run, as they were made.
const specVersion = 2

// createSpecVersion is the generation Create gives a sandbox: specVersion
// (a test sets 0 to make the sandboxes older drivers made).
var createSpecVersion = specVersion

// rootMountPoints are the destinations of ociSpec's mounts that lie in the
// layer itself (the others are inside /dev's tmpfs). Each must be a real
// directory of the layer, or absent, before the runtime starts: runsc
// resolves destinations inside the root, but a symlinked one would still
// put a mount somewhere else than the sandbox expects (TestOCISpec keeps
// this list equal to the spec's).
var rootMountPoints = []string{"/proc", "/dev", "/sys", "/tmp"}

// ociSpec is the config.json of a sandbox whose root is rootfs (the layer's
// merged directory). tmpSource is the source of the /tmp bind: a directory
// of the driver's onto which the layer's /tmp is bound by descriptor while
// the runtime starts (mountSource), not rootfs+"/tmp", a name the tenant
// controls and the host would resolve. agentSource (generation 2) is the
// agent binary of rec.AgentBuild in the driver's store: a file of the
// driver's (0555, in a 0700 directory), never a name inside the layer.
func ociSpec(rec *record, rootfs, tmpSource, agentSource string) *specs.Spec {
	lim := rec.Limits
	mem := lim.MemoryBytes
	quota := lim.MilliCPUs * cpuPeriod / 1000
	period := uint64(cpuPeriod)
	swappiness := uint64(0)
	oom := oomScoreAdj
	hostPids := hostPidsLimit(lim.Pids)
	noSuid := []string{"nosuid", "noexec", "nodev"}
	tmpOpts := []string{"rbind", "rw"}
	if rec.SpecVersion >= 1 {
		tmpOpts = append(tmpOpts, "nosuid", "nodev")
	}
	args, env, user := []string{"/bin/sh", "-c", initScript}, rec.Env, specs.User{UID: rec.UID, GID: rec.GID}
	if rec.SpecVersion >= 2 {
		// The agent is the init, as the sandbox's root (in gVisor's
		// kernel, with defaultCaps only): it starts every process as
		// the template's user, reads every process's /proc entry and
		// signals any of them. Its token arrives in its environment,
		// which the agent clears before it starts anything; the
		// template's environment is given to the processes it starts,
		// not used by the agent.
		args = []string{agentproto.Path}
		env = append(append([]string(nil), rec.Env...), agentproto.TokenEnv+"="+rec.AgentToken)
		user = specs.User{}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: noSuid},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: append([]string{"ro"}, noSuid...)},
		// runsc mounts a tmpfs on an empty /tmp unless the spec
		// mounts something there. A tmpfs would hold /tmp in the
		// sandbox's memory (a big temp file would count against the
		// memory limit, not the disk limit) and out of reach of
		// Files(). Binding the layer's own /tmp keeps it on disk,
		// in the writable layer, like every other directory.
		{Destination: "/tmp", Type: "bind", Source: tmpSource, Options: tmpOpts},
	}
	if rec.SpecVersion >= 2 {
		// Inside /dev's tmpfs: not in the layer (a checkpoint's
		// layer.tar never holds it, Files never sees it), and the
		// mount point is made by runsc in the tmpfs, not in a
		// directory the tenant controls. Read-only: the sandbox's
		// root cannot change the binary every later restore maps.
		mounts = append(mounts, specs.Mount{Destination: agentproto.Path, Type: "bind", Source: agentSource, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	return &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			Args:         args,
			Env:          env,
			Cwd:          "/",
			User:         user,
			Capabilities: caps(),
			Rlimits:      rlimits(rec),
			OOMScoreAdj:  &oom,
			// A set-uid binary or file capability in the layer raises
			// nothing (generation 1 on; see specVersion).
			NoNewPrivileges: rec.SpecVersion >= 1,
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: rec.ID,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: rec.Cgroup,
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem, Swappiness: &swappiness},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:   &specs.LinuxPids{Limit: &hostPids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: rec.Netns},
			},
		},
	}
}
