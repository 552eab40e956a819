package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
)

// usageScript sends N POSTs of 500 bytes through the gateway; each answer
// is 1000 bytes.
const usageScript = `import sys, urllib.request
base, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    r = urllib.request.urlopen(urllib.request.Request(base + "/u/%d" % i, data=b"p" * 500, method="POST"), timeout=30)
    body = r.read()
    print(r.status, len(body))
`

// TestE2EUsage meters a known workload through the real daemon (metering
// every second): 20 requests through the gateway to a server on 127.0.0.1
// (500 bytes up, 1000 down each), and a CPU burner at a 1-CPU limit during
// which the daemon is SIGKILLed and started again. Then amber usage must
// show exactly 20 egress requests and 30000 bytes (±5 %), and CPU-seconds
// at least the sandbox cgroup's own counter read just before the sandbox
// was killed and at most 5 % more: the restarted daemon continued from the
// last record (a lost baseline would count the counter twice; records
// lost in the crash would show less). The driver tests check that counter
// against the host's per-process CPU time (sandboxtest.Usage).
func TestE2EUsage(t *testing.T) {
	bin, dir := e2eSetup(t)
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		served.Add(1)
		w.Write([]byte(strings.Repeat("x", 1000)))
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	dest := fmt.Sprintf("data.test:%d", port)
	addr := freeAddr(t)
	flags := []string{"--pool", "0", "--meter-interval", "1s", "--egress-host", "data.test=127.0.0.1"}
	d := startDaemon(t, bin, dir, addr, flags...)

	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "python", "--cpus", "1", "--egress-allow", dest))
	if out, errs, code := d.amberIn(usageScript, "files", "put", id, "-", "/root/usage.py"); code != 0 {
		t.Fatalf("files put: %d %s %s", code, out, errs)
	}
	const n = 20
	out := d.must("exec", id, "--", "python3", "/root/usage.py", "http://"+dest, strconv.Itoa(n))
	if got := strings.Count(out, "200 1000"); got != n || served.Load() != n {
		t.Fatalf("%d of %d requests answered 200 with 1000 bytes, the server saw %d:\n%s", got, n, served.Load(), out)
	}

	cg, _ := filepath.Glob("/sys/fs/cgroup/cpuacct/amber/*/" + id + "/cpuacct.usage")
	if len(cg) != 1 {
		t.Fatalf("cgroup of %s: %v", id, cg)
	}
	counter := func() float64 {
		b, err := os.ReadFile(cg[0])
		if err != nil {
			t.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return float64(ns) / 1e9
	}
	before, beforeAt := counter(), time.Now()
	start := time.Now()
	d.must("exec", "-d", id, "--", "timeout", "5", "sh", "-c", "while :; do :; done")
	// Kill the daemon 0.5 s into an interval, at least 2 s into the burn.
	time.Sleep(2 * time.Second)
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(1500 * time.Millisecond).Sub(now))
	d.stop(syscall.SIGKILL)
	d = startDaemon(t, bin, dir, addr, flags...)
	time.Sleep(time.Until(start.Add(5500 * time.Millisecond)))
	ref, refAt := counter(), time.Now()
	d.must("sandbox", "kill", id)
	time.Sleep(2500 * time.Millisecond) // the last records

	var rep api.UsageReport
	if err := json.Unmarshal([]byte(d.must("--json", "usage", "--group-by", "sandbox")), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, r := range rep.Rows {
		if r.Sandbox == id {
			got[r.Meter] = r.Quantity
		}
	}
	t.Logf("usage of %s: %v; cgroup CPU counter %.3f s (burner: %.3f s over 5 s at 1 CPU)", id, got, ref, ref-before)
	if got["egress_requests"] != n {
		t.Errorf("egress_requests %v, want %d", got["egress_requests"], n)
	}
	if b, want := got["egress_bytes"], float64(n*1500); b < want*0.95 || b > want*1.05 {
		t.Errorf("egress_bytes %v, want %v ±5 %%", b, want)
	}
	if ref-before < 0.5 {
		t.Fatalf("the burner got %.3f CPU-seconds: nothing to measure", ref-before)
	}
	// The 1-CPU limit bounds the whole cgroup (the burner, gVisor's own
	// work) over the wall time between the two readings (≈5.5 s here, not
	// the burner's 5 s).
	if wall := refAt.Sub(beforeAt).Seconds(); ref-before > wall*1.05 {
		t.Errorf("the sandbox used %.3f CPU-seconds in %.3f s at a 1-CPU limit", ref-before, wall)
	}
	if c := got["cpu_seconds"]; c < ref-0.001 || c > ref*1.05 {
		t.Errorf("cpu_seconds %.3f, want the counter's %.3f (+5 %% at most)", c, ref)
	}
	if got["memory_gib_seconds"] <= 0 {
		t.Error("no memory_gib_seconds")
	}

	csv := d.must("usage", "--csv")
	if !strings.HasPrefix(csv, "tenant,group_by,sandbox,day,meter,quantity,records\n") || !strings.Contains(csv, ",egress_requests,20,") {
		t.Errorf("usage --csv:\n%s", csv)
	}
	// Prometheus: this daemon (started after the requests) counted the CPU
	// it recorded.
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var promCPU float64
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, `amber_usage_total{meter="cpu_seconds",tenant="default"} `); ok {
			promCPU, _ = strconv.ParseFloat(v, 64)
		}
	}
	if promCPU <= 0 || promCPU > got["cpu_seconds"]+1e-6 {
		t.Errorf("amber_usage_total cpu_seconds of default = %v (recorded in all %v)", promCPU, got["cpu_seconds"])
	}

	table := d.must("usage")
	if !strings.Contains(table, "cpu_seconds") {
		t.Errorf("usage:\n%s", table)
	}
}
