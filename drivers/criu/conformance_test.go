package criu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestConformance runs the driver conformance suite against the real kernel
// and the busybox template:
//
//	go test -tags seccomp -count=1 -run TestConformance -v ./drivers/criu
func TestConformance(t *testing.T) {
	requireHost(t)
	td := newTestDriver(t)
	newDriver := func(t *testing.T) sandbox.Driver {
		d, err := New(td.options())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Issue 20: every command of the suite goes through the agent, none
	// through libcontainer's exec.
	execs := libcontainerExecs.Load()
	defer func() {
		if n := libcontainerExecs.Load() - execs; n != 0 {
			t.Errorf("%d commands started with libcontainer's exec during the suite, want 0", n)
		}
	}()
	sandboxtest.Run(t, newDriver, sandboxtest.Options{
		MinimalTemplate: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)},
		CPUUsage: func(id string) (time.Duration, error) {
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", td.parent, id, "cpuacct.usage"))
			if err != nil {
				return 0, err
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns), err
		},
		Leftovers: td.leftovers,
	})
}

// leftovers lists what the driver still keeps on the host for id.
func (td *testDriver) leftovers(id string) []string {
	var out []string
	for _, p := range []string{td.recordDir(id), filepath.Join(td.runc, id)} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "cpuset", "pids", "freezer", "devices", "blkio", "systemd", "unified"} {
		p := filepath.Join("/sys/fs/cgroup", ctrl, td.parent, id)
		if _, err := os.Stat(p); err == nil {
			out = append(out, "cgroup "+p)
		}
	}
	return out
}
