package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/sandbox"
)

// hostWorks fails the test unless the host can still fork and exec.
func hostWorks(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "/bin/sh", "-c", "echo host-ok").Output(); err != nil || string(out) != "host-ok\n" {
		t.Errorf("the host cannot run a command: %q %v", out, err)
	}
}

// testMemoryLimit: a process allocating past the sandbox's memory limit
// fails or is killed; the same allocation succeeds in a sandbox whose limit
// allows it (so the hog is a real one), the host keeps working, and the
// hogged sandbox is either still running or reported stopped (a driver may
// stop a sandbox whose memory cgroup ran out) — never left in between.
func (s *suite) testMemoryLimit(t *testing.T) {
	const limit = 128 << 20
	small := s.create(t, "mem-small", sandbox.Limits{MemoryBytes: limit})
	big := s.create(t, "mem-big", sandbox.Limits{MemoryBytes: 1 << 30})
	// dd allocates its block (256 MiB) and fills it from /dev/zero.
	hog := []string{"/bin/sh", "-c", "dd if=/dev/zero of=/dev/null bs=256M count=1 2>&1 && echo HOG-DONE"}

	start := time.Now()
	r, err := s.exec(t, small, sandbox.ExecSpec{Args: hog, Timeout: time.Minute})
	t.Logf("hog in a %d MiB sandbox: %+v, %v, after %v, output %q", limit>>20, r.ExitStatus, err, time.Since(start).Round(time.Millisecond), r.Stdout)
	if err == nil && (r.Code == 0 || strings.Contains(r.Stdout, "HOG-DONE")) {
		t.Errorf("a 256 MiB allocation succeeded under a %d MiB limit", limit>>20)
	}
	if r.TimedOut {
		t.Errorf("the hog was not stopped by the limit within a minute (timed out)")
	}
	// The user is told why: the exec's status (a killed command) or the
	// error (a driver that stops the whole sandbox) names the limit.
	oom := sandbox.OutOfMemory(limit)
	switch {
	case err != nil && !strings.Contains(err.Error(), oom):
		t.Errorf("the hog's error %q does not say %q", err, oom)
	case err == nil && (r.Signal == "SIGKILL" || r.Code == 137) && r.Reason != oom:
		t.Errorf("the hog was killed (%+v) without the reason %q", r.ExitStatus, oom)
	}
	// A SIGKILL that is not the limit's is not called out of memory.
	if r, err := s.exec(t, big, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "kill -9 $$"}}); err != nil || r.Code != 137 || r.Reason != "" {
		t.Errorf("kill -9 of the command itself: %+v %v (want SIGKILL and no reason)", r.ExitStatus, err)
	}

	if r, err := s.exec(t, big, sandbox.ExecSpec{Args: hog, Timeout: time.Minute}); err != nil || r.Code != 0 {
		t.Errorf("the same hog under a 1 GiB limit: %+v %v %q (the hog must be able to succeed)", r.ExitStatus, err, r.Stdout)
	}
	if out := s.sh(t, big, "echo ok"); out != "ok\n" {
		t.Errorf("second sandbox: %q", out)
	}
	hostWorks(t)

	info, err := s.d.Inspect(ctxFor(t, callTimeout), small)
	switch {
	case err != nil:
		t.Errorf("Inspect of the hogged sandbox: %v", err)
	case info.State == sandbox.StateRunning:
		if out := s.sh(t, small, "echo still-here"); out != "still-here\n" {
			t.Errorf("hogged sandbox reports running but: %q", out)
		}
		t.Logf("the hogged sandbox is still running")
	case info.State == sandbox.StateStopped:
		t.Logf("the driver stopped the hogged sandbox (its memory cgroup ran out)")
	default:
		t.Errorf("hogged sandbox state %q", info.State)
	}
}

// testPidsLimit: a fork bomb runs into the pids limit (its own errors say
// so) while a second sandbox and the host keep working; Kill stops it.
func (s *suite) testPidsLimit(t *testing.T) {
	bombed := s.create(t, "pids-bomb", sandbox.Limits{Pids: 64})
	other := s.create(t, "pids-other", sandbox.Limits{})
	r := s.shStatus(t, bombed, `(b() { b | b & }; b) </dev/null >/dev/null 2>/tmp/bomb.err &`)
	if r.Code != 0 {
		t.Fatalf("starting the bomb: %+v %q", r.ExitStatus, r.Stderr)
	}
	time.Sleep(3 * time.Second)
	start := time.Now()
	if out := s.sh(t, other, "echo ok; ls / >/dev/null"); out != "ok\n" {
		t.Errorf("second sandbox during the bomb: %q", out)
	}
	t.Logf("second sandbox exec during the bomb took %v", time.Since(start).Round(time.Millisecond))
	hostWorks(t)
	if err := s.d.Kill(ctxFor(t, 2*time.Minute), bombed); err != nil {
		t.Fatalf("Kill of the bombed sandbox: %v", err)
	}
	errs, err := readFile(t, s.files(t, bombed), "/tmp/bomb.err")
	if err != nil {
		t.Fatalf("reading the bomb's errors: %v", err)
	}
	if !strings.Contains(errs, "fork") && !strings.Contains(errs, "unavailable") && !strings.Contains(errs, "Resource") {
		head := errs
		if len(head) > 500 {
			head = head[:500]
		}
		t.Errorf("the fork bomb never failed to fork (%d bytes of errors: %q): no pids limit", len(errs), head)
	}
	t.Logf("bomb errors: %d bytes", len(errs))
}

// testDiskLimit: writing past the disk limit fails with ENOSPC inside the
// sandbox; the file stays near the limit; the host's filesystems do not
// lose the difference; the sandbox works again once the file is removed.
func (s *suite) testDiskLimit(t *testing.T) {
	const limit = 64 << 20
	id := s.create(t, "disk", sandbox.Limits{DiskBytes: limit})
	freeBefore := hostFree(t)
	r := s.shStatus(t, id, "dd if=/dev/zero of=/fill bs=1M count=1024 2>&1; echo rc=$?")
	t.Logf("filler: %q", r.Stdout)
	if strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("writing 1 GiB under a %d MiB disk limit succeeded", limit>>20)
	}
	if !strings.Contains(strings.ToLower(r.Stdout), "no space") {
		t.Errorf("filler did not fail with ENOSPC: %q", r.Stdout)
	}
	fi, err := s.files(t, id).Stat(ctxFor(t, callTimeout), "/fill")
	if err != nil || fi.Size > limit+(8<<20) {
		t.Errorf("/fill = %+v, %v; want at most about %d bytes", fi, err, limit)
	}
	for path, before := range freeBefore {
		after := hostFree(t)[path]
		if lost := before - after; lost > 512<<20 {
			t.Errorf("host filesystem at %s lost %d MiB while the sandbox filled its %d MiB disk", path, lost>>20, limit>>20)
		}
	}
	if out := s.sh(t, id, "rm /fill && echo ok > /after && cat /after"); out != "ok\n" {
		t.Errorf("after freeing space: %q", out)
	}
}

// hostFree returns the free bytes of the filesystems holding / and the
// temp directory.
func hostFree(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range []string{"/", os.TempDir()} {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			t.Fatalf("statfs %s: %v", p, err)
		}
		out[p] = int64(st.Bavail) * st.Bsize
	}
	return out
}

// testCPULimit: a busy loop under a 0.5 CPU quota uses about half a CPU.
// A second sandbox allowed two CPUs runs the same loop at the same time:
// it shows what the host could give, so that a loaded host is not taken
// for a working limit (the lower bound is only checked when the control
// got most of a CPU; the upper bound always is). On a host so busy that
// the control gets less than 0.8 CPU the test is skipped as inconclusive.
func (s *suite) testCPULimit(t *testing.T) {
	limited := s.create(t, "cpu-half", sandbox.Limits{MilliCPUs: 500})
	control := s.create(t, "cpu-control", sandbox.Limits{MilliCPUs: 2000})
	ctx := ctxFor(t, 3*time.Minute)
	loop := sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while :; do :; done"}}
	pl, err := s.d.Start(ctx, limited, loop)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := s.d.Start(ctx, control, loop)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // let both settle
	const window = 5 * time.Second
	usage := func(id string, pid int) (time.Duration, error) {
		if s.opts.CPUUsage != nil {
			return s.opts.CPUUsage(id)
		}
		return procCPU(t, s, id, pid)
	}
	l0, err1 := usage(limited, pl)
	c0, err2 := usage(control, pc)
	t0 := time.Now()
	time.Sleep(window)
	l1, err3 := usage(limited, pl)
	c1, err4 := usage(control, pc)
	wall := time.Since(t0)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			t.Fatalf("measuring CPU: %v", err)
		}
	}
	lim := float64(l1-l0) / float64(wall)
	ctl := float64(c1-c0) / float64(wall)
	how := "inside the sandbox (utime+stime)"
	if s.opts.CPUUsage != nil {
		how = "by the driver's CPUUsage"
	}
	t.Logf("CPU over %v, measured %s: limited to 0.5 → %.2f CPUs; control (2 CPUs) → %.2f CPUs", wall.Round(time.Millisecond), how, lim, ctl)
	if lim > 0.65 {
		t.Errorf("a 0.5 CPU quota let the loop use %.2f CPUs", lim)
	}
	switch {
	case ctl >= 0.8 && lim < 0.35:
		t.Errorf("the 0.5 CPU sandbox got only %.2f CPUs while the host had room (control %.2f)", lim, ctl)
	case ctl < 0.8 && lim <= 0.65:
		// Without a quota the loop would get what the control got:
		// nothing here tells a working limit from a busy host.
		t.Skipf("inconclusive: the host is too busy (the unlimited control got %.2f CPUs)", ctl)
	}
}

// procCPU reads utime+stime of pid inside sandbox id.
func procCPU(t *testing.T, s *suite, id string, pid int) (time.Duration, error) {
	out := s.sh(t, id, fmt.Sprintf("cat /proc/%d/stat", pid))
	i := strings.LastIndexByte(out, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad stat %q", out)
	}
	f := strings.Fields(out[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("bad stat %q", out)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad stat %q", out)
	}
	// USER_HZ is 100 on Linux (and in gVisor).
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
