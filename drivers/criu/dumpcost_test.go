package criu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestDumpSkipsProbes: a cut's CRIU run loads the kernel-feature cache
// the run before kept (criu-4.1.1-kdat-cache.patch: /run is not a tmpfs
// here), runs no `ip` or iptables-save process and reads nothing of the
// network namespace, conntrack included (--empty-ns net and
// criu-4.1.1-empty-netns-dump.patch). Each was a share of the frozen
// window (docs/benchmarks.md); dump.log says which ran.
func TestDumpSkipsProbes(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := td.create(sandbox.Limits{})
	var log string
	for range 2 {
		if _, err := td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(td.recordDir(id), "criu-work", "dump.log"))
		if err != nil {
			t.Fatal(err)
		}
		log = string(b)
	}
	if !strings.Contains(log, "Loaded kdat cache from") {
		t.Errorf("the second cut's CRIU probed the kernel again: %s", grepLines(log, "kdat"))
	}
	for _, ran := range []string{"Running ip ", "iptables-save", "iptables-legacy-save", "Dumping netns links", "Mount ns' sysfs"} {
		if strings.Contains(log, ran) {
			t.Errorf("the cut's CRIU dumped the network namespace: %s", grepLines(log, ran))
		}
	}
}

// TestCriuConfigYard: the CRIU configuration names the cgroup yard only
// when there is one.
func TestCriuConfigYard(t *testing.T) {
	if got := criuConfigFor(""); got != criuConfig || strings.Contains(got, "cgroup-yard") {
		t.Errorf("no yard: %q", got)
	}
	if got := criuConfigFor("/sys/fs/cgroup"); !strings.HasSuffix(got, "\ncgroup-yard /sys/fs/cgroup\n") || !strings.HasPrefix(got, "network-lock nftables\n") {
		t.Errorf("with a yard: %q", got)
	}
}
