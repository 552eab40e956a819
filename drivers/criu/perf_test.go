package criu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestPerf measures cold Create (p50/p99 over 20), the Exec round trip and
// idle memory per sandbox. It runs only with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 go test -tags seccomp -run TestPerf -v ./drivers/criu
func TestPerf(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to measure")
	}
	td := newTestDriver(t)
	ctx := context.Background()
	rootfs := minimalRootfs(t)
	// Warm up: the layer package formats its ext4 prototype once per size.
	warm := td.create(sandbox.Limits{})
	if err := td.Destroy(ctx, warm); err != nil {
		t.Fatal(err)
	}

	const n = 20
	memBefore, slabBefore, bufBefore := meminfo(t, "MemAvailable:"), meminfo(t, "Slab:"), meminfo(t, "Buffers:")
	var creates []time.Duration
	var ids []string
	for i := 0; i < n; i++ {
		id := newID("perf")
		start := time.Now()
		if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: rootfs}}); err != nil {
			t.Fatal(err)
		}
		creates = append(creates, time.Since(start))
		ids = append(ids, id)
	}
	time.Sleep(2 * time.Second) // let the sandboxes settle
	memAfter, slabAfter, bufAfter := meminfo(t, "MemAvailable:"), meminfo(t, "Slab:"), meminfo(t, "Buffers:")
	var diskUsed int64
	for _, id := range ids {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(td.layerDir(id), "disk.img"), &st); err == nil {
			diskUsed += st.Blocks * 512
		}
	}
	var cgMem int64
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", td.parent, id, "memory.usage_in_bytes"))
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		cgMem += v
	}

	var execs []time.Duration
	for i := 0; i < 50; i++ {
		start := time.Now()
		st, err := td.Exec(ctx, ids[i%n], sandbox.ExecSpec{Args: []string{"true"}})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %+v %v", st, err)
		}
		execs = append(execs, time.Since(start))
	}

	var destroys []time.Duration
	for _, id := range ids {
		start := time.Now()
		if err := td.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		destroys = append(destroys, time.Since(start))
	}
	t.Logf("cold create (n=%d): p50 %v p99 %v max %v", n, pct(creates, 50), pct(creates, 99), pct(creates, 100))
	t.Logf("exec round trip `true` (n=%d): p50 %v p99 %v", len(execs), pct(execs, 50), pct(execs, 99))
	t.Logf("destroy (n=%d): p50 %v p99 %v", n, pct(destroys, 50), pct(destroys, 99))
	t.Logf("idle memory per sandbox: cgroup usage %s; host: slab %+.2f MiB, buffers %+.2f MiB, MemAvailable %+.2f MiB (noisy on a shared host)",
		mib(cgMem/n), fmib((slabAfter-slabBefore)/n), fmib((bufAfter-bufBefore)/n), fmib((memAfter-memBefore)/n))
	t.Logf("host disk per idle sandbox (sparse layer image): %s", mib(diskUsed/n))
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return s[i-1].Round(100 * time.Microsecond)
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }

func meminfo(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v << 10
		}
	}
	t.Fatal("no " + field)
	return 0
}

func fmib(b int64) float64 { return float64(b) / (1 << 20) }
