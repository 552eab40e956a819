package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// UsageOptions configure Usage.
type UsageOptions struct {
	// HostPIDs returns the host pids of every process of sandbox id (its
	// cgroup's cgroup.procs). Their utime+stime, read from the host's
	// /proc, is the reference the driver's CPU counter is checked against:
	// per-task accounting, not the cgroup's.
	HostPIDs func(id string) []int
}

// Usage checks a driver's sandbox.UsageReporter against a known workload:
// a CPU burner at a 1-CPU limit (`sh -c 'while :; do :; done'`, started in
// the background so none of its processes exit inside the window) runs
// until the reference says it used at least 2 CPU-seconds; the driver's
// CPU delta over the same window must be within ±5 % of the reference and
// must not exceed the quota (wall time × 1 CPU, +5 %). Then 48 MiB put in
// the sandbox's /dev/shm must show in MemoryBytes (+48 MiB ±5 %, allowing
// 4 MiB for the runtime's own movement), and a killed sandbox's Usage is
// ErrFailedPrecondition.
func Usage(t *testing.T, d sandbox.Driver, tmpl sandbox.Template, id string, o UsageOptions) {
	ur, ok := d.(sandbox.UsageReporter)
	if !ok {
		t.Fatalf("driver %s does not implement sandbox.UsageReporter", d.Name())
	}
	ctx := context.Background()
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: tmpl, Limits: sandbox.Limits{MilliCPUs: 1000, MemoryBytes: 512 << 20}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	hostCPU := func() time.Duration {
		var sum time.Duration
		for _, pid := range o.HostPIDs(id) {
			sum += procStatCPU(pid)
		}
		return sum
	}
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while :; do :; done"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the burner and its runtime threads exist
	u0, err := ur.Usage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	r0, t0 := hostCPU(), time.Now()
	var u1 sandbox.Usage
	var r1 time.Duration
	for {
		time.Sleep(500 * time.Millisecond)
		if u1, err = ur.Usage(ctx, id); err != nil {
			t.Fatal(err)
		}
		r1 = hostCPU()
		if r1-r0 >= 2*time.Second || time.Since(t0) > 40*time.Second {
			break
		}
	}
	wall := time.Since(t0)
	if err := d.Signal(ctx, id, pid, os.Kill); err != nil {
		t.Fatal(err)
	}
	metered := time.Duration(u1.CPUNanos - u0.CPUNanos)
	ref := r1 - r0
	t.Logf("burner over %v at 1 CPU: metered %v, host per-process reference %v (%.2f CPUs)", wall.Round(time.Millisecond), metered, ref, float64(ref)/float64(wall))
	if ref < time.Second {
		t.Fatalf("the burner got only %v of CPU in %v: no measurement", ref, wall)
	}
	if diff := float64(metered-ref) / float64(ref); diff > 0.05 || diff < -0.05 {
		t.Errorf("metered CPU %v is %.1f %% off the reference %v", metered, 100*diff, ref)
	}
	if float64(metered) > 1.05*float64(wall) {
		t.Errorf("metered CPU %v exceeds what a 1-CPU quota allows in %v", metered, wall)
	}

	// Memory: 48 MiB in tmpfs (/dev/shm holds 64 MiB under gVisor).
	time.Sleep(200 * time.Millisecond)
	m0, err := ur.Usage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st, err := d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "mkdir -p /dev/shm && dd if=/dev/zero of=/dev/shm/fill bs=1048576 count=48 2>&1 && sync"}, Stdout: &out, Stderr: &out})
	if err != nil || st.Code != 0 {
		t.Fatalf("fill: %v %+v %s", err, st, out.String())
	}
	m1, err := ur.Usage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	grew := int64(m1.MemoryBytes) - int64(m0.MemoryBytes)
	t.Logf("memory: %d → %d bytes (+%.1f MiB for 48 MiB written to /dev/shm)", m0.MemoryBytes, m1.MemoryBytes, float64(grew)/(1<<20))
	if want := int64(48 << 20); grew < want*95/100-4<<20 || grew > want*105/100+4<<20 {
		t.Errorf("memory grew by %d bytes, want 48 MiB ±5 %%", grew)
	}

	if err := d.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := ur.Usage(ctx, id)
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Usage of a killed sandbox: %v, want ErrFailedPrecondition", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procStatCPU is utime+stime of host process pid (every thread, dead ones
// too), 0 if it is gone.
func procStatCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
