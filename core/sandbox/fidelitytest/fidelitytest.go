// Package fidelitytest holds the extended fidelity checks of core/sandbox's
// Checkpointer: workloads too heavy for the default test run, which need
// templates built from Debian packages (scripts/setup/chromium-template.sh,
// scripts/setup/postgres-template.sh). Each driver runs them from a test
// file built only with the `extended` tag (`make test-extended`):
//
//	//go:build extended
//
//	func TestFidelityBrowser(t *testing.T) {
//		fidelitytest.Browser(t, newDriver(t), fidelitytest.LookupTemplate(t, "chromium"))
//	}
//
// # Shape of every check
//
// A workload is started in a sandbox and holds state that exists only in
// the memory of its processes and was drawn at random inside the sandbox
// (a page's JavaScript token, a database session's application_name). The
// test reads that state, checkpoints the sandbox, kills it (SIGKILL of
// every process, Driver.Kill), restores it from the image and reads the
// state again: it must be the same state, continued. Then the same
// workload runs in a fresh sandbox that was never restored and the same
// check is run against the state of before the cut: it must fail, which
// proves the check can tell a restored workload from a restarted one.
//
// Every part of the state is checked and logged on its own (which parts
// survived), so a driver that restores some but not all of it is reported
// exactly.
//
// # Cleanup
//
// Every sandbox is destroyed in t.Cleanup, also when the test fails.
package fidelitytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// Driver is what the checks need: a sandbox driver that can checkpoint.
type Driver interface {
	sandbox.Driver
	sandbox.Checkpointer
}

// LookupTemplate returns the newest built template called name from the
// template cache ($AMBER_CACHE/templates, default /var/cache/amber), with
// the env, cwd, user and limits of its template.json. A missing template
// fails the test: the extended run builds the templates first
// (`make test-extended`), so a missing one is a broken setup, not a reason
// to pass quietly.
func LookupTemplate(t testing.TB, name string) sandbox.Template {
	t.Helper()
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	m, _ := filepath.Glob(filepath.Join(cache, "templates", name+"-*", ".complete"))
	if len(m) == 0 {
		t.Fatalf("no %s template in %s/templates: run `make setup-%s-template`", name, cache, name)
	}
	sort.Strings(m)
	dir := filepath.Dir(m[len(m)-1])
	tmpl := sandbox.Template{Name: name, Version: filepath.Base(dir), RootFS: filepath.Join(dir, "rootfs")}
	if b, err := os.ReadFile(filepath.Join(dir, "template.json")); err == nil {
		var over struct {
			Env    []string       `json:"env"`
			Cwd    string         `json:"cwd"`
			User   string         `json:"user"`
			Limits sandbox.Limits `json:"limits"`
		}
		if err := json.Unmarshal(b, &over); err != nil {
			t.Fatalf("%s/template.json: %v", dir, err)
		}
		tmpl.Env, tmpl.Cwd, tmpl.User, tmpl.Limits = over.Env, over.Cwd, over.User, over.Limits
	}
	return tmpl
}

var idSeq struct {
	sync.Mutex
	n int
}

// newID returns a sandbox id unique in this test binary and among test
// binaries running at once (it carries the PID).
func newID(prefix string) string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), idSeq.n)
}

// create makes a sandbox from tmpl that is destroyed when the test ends.
func create(t *testing.T, d Driver, prefix string, tmpl sandbox.Template) sandbox.Spec {
	t.Helper()
	spec := sandbox.Spec{ID: newID(prefix), Template: tmpl, Limits: tmpl.Limits}
	if _, err := d.Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Destroy(context.Background(), spec.ID); err != nil {
			t.Errorf("cleanup: destroy %s: %v", spec.ID, err)
		}
	})
	return spec
}

// sh runs a shell script in sandbox id and returns its stdout; a non-zero
// exit is an error that carries stderr.
func sh(d Driver, id, script string, timeout time.Duration) (string, error) {
	var out, errb bytes.Buffer
	st, err := d.Exec(context.Background(), id, sandbox.ExecSpec{
		Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &errb, Timeout: timeout,
	})
	if err != nil {
		return "", err
	}
	if st.Code != 0 {
		return out.String(), fmt.Errorf("exit %d (%s): %s", st.Code, st.Signal, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func mustSh(t *testing.T, d Driver, id, script string) string {
	t.Helper()
	out, err := sh(d, id, script, 2*time.Minute)
	if err != nil {
		t.Fatalf("in %s: %q: %v", id, script, err)
	}
	return out
}

// start runs args in the background in sandbox id and returns its PID.
func start(t *testing.T, d Driver, id string, args ...string) int {
	t.Helper()
	return startEnv(t, d, id, nil, args...)
}

// startEnv is start with env added to the sandbox's environment.
func startEnv(t *testing.T, d Driver, id string, env []string, args ...string) int {
	t.Helper()
	pid, err := d.Start(context.Background(), id, sandbox.ExecSpec{Args: args, Env: env})
	if err != nil {
		t.Fatalf("start %q in %s: %v", args, id, err)
	}
	return pid
}

// procLog returns the log of a Start'ed process (see sandbox.Driver.Start).
func procLog(d Driver, id string, pid int) string {
	out, err := sh(d, id, fmt.Sprintf("cat /run/amber/proc/%d.log", pid), time.Minute)
	if err != nil {
		return fmt.Sprintf("(no log of %d: %v)", pid, err)
	}
	return out
}

// ticks returns the start ticks of pids in sandbox id (absent ones are
// left out): a restored process keeps its PID and its start ticks, a
// restarted one does not.
func ticks(d Driver, id string, pids ...int) (map[int]uint64, error) {
	ps, err := d.Processes(context.Background(), id)
	if err != nil {
		return nil, err
	}
	m := map[int]uint64{}
	for _, p := range ps {
		for _, want := range pids {
			if p.PID == want {
				m[p.PID] = p.StartTicks
			}
		}
	}
	return m, nil
}

// cut checkpoints sandbox spec.ID into a new image, kills it and restores
// it from the image, logging how long each step took. A failed checkpoint
// is returned (Checkpoint resumes the sandbox, so the caller can go on
// with it); any later failure ends the test.
func cut(t *testing.T, d Driver, spec sandbox.Spec, lap func(string)) (sandbox.RestoreStats, error) {
	t.Helper()
	ctx := context.Background()
	image := filepath.Join(t.TempDir(), "image")
	cs, err := d.Checkpoint(ctx, spec.ID, image, sandbox.CheckpointOptions{})
	if err != nil {
		return sandbox.RestoreStats{}, fmt.Errorf("checkpoint %s: %w", spec.ID, err)
	}
	lap(fmt.Sprintf("checkpointed (frozen %v, memory %d MiB, layer %d KiB)", cs.Frozen.Round(time.Millisecond), cs.MemoryBytes>>20, cs.LayerBytes>>10))
	if err := d.Kill(ctx, spec.ID); err != nil {
		t.Fatalf("kill %s: %v", spec.ID, err)
	}
	// The driver may take a moment to see its runtime's end (gvisor's
	// `runsc state` lags behind Kill; drivers/gvisor's TestCheckpoint
	// waits the same way); a lag is logged, a sandbox that stays running
	// fails the test.
	killed := time.Now()
	for {
		info, err := d.Inspect(ctx, spec.ID)
		if err == nil && info.State == sandbox.StateStopped {
			if lag := time.Since(killed); lag > 100*time.Millisecond {
				t.Logf("Inspect said %s only %v after Kill returned", sandbox.StateStopped, lag.Round(time.Millisecond))
			}
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("10s after kill: %+v %v, want %s", info, err, sandbox.StateStopped)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Lazy where the driver can, as the engine asks: the checks then run
	// while pages may still be loading. The image stays until the load
	// ended (a cleanup registered after the image's TempDir runs first).
	rs, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{Lazy: d.Capabilities().LazyRestore})
	if err != nil {
		t.Fatalf("restore %s: %v", spec.ID, err)
	}
	if rs.Loaded != nil {
		t.Cleanup(func() {
			if err := <-rs.Loaded; err != nil {
				t.Errorf("restore %s: the lazy load failed: %v", spec.ID, err)
			}
		})
	}
	lap(fmt.Sprintf("killed and restored (running after %v, lazy %v, %d processes, %d connections restored, %d reset)",
		rs.Running.Round(time.Millisecond), rs.Lazy, rs.Processes, rs.ConnectionsRestored, rs.ConnectionsReset))
	for _, l := range rs.NotRestored {
		lap(fmt.Sprintf("not restored: %s (%d): %s", l.Kind, l.Count, l.Detail))
	}
	return rs, nil
}

// part is the outcome of checking one part of a workload's state.
type part struct {
	name string
	err  error
}

// report logs every part's outcome and returns the names of those that
// failed.
func report(t *testing.T, what string, parts []part) (failed []string) {
	t.Helper()
	for _, p := range parts {
		if p.err != nil {
			t.Logf("%s: %-13s LOST: %v", what, p.name, p.err)
			failed = append(failed, p.name)
		} else {
			t.Logf("%s: %-13s survived", what, p.name)
		}
	}
	return failed
}

// lapper returns a function that logs a step with the time since the test
// began.
func lapper(t *testing.T) func(string) {
	begin := time.Now()
	return func(what string) { t.Logf("%6.1fs %s", time.Since(begin).Seconds(), what) }
}
