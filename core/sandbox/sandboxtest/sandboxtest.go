// Package sandboxtest is the conformance suite of core/sandbox: one set of
// tests that every isolation driver runs against a real host.
//
//	func TestConformance(t *testing.T) {
//		stateDir := t.TempDir()
//		sandboxtest.Run(t, func(t *testing.T) sandbox.Driver {
//			d, err := mydriver.New(mydriver.Options{StateDir: stateDir})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return d
//		}, sandboxtest.Options{MinimalTemplate: busyboxTemplate(t)})
//	}
//
// The suite needs root (it creates real sandboxes) and a template whose
// root filesystem is a static busybox with its applets (sh, nc, wget,
// httpd, dd, find, ip, ...), as scripts/setup/busybox.sh builds.
//
// # What it checks
//
// Lifecycle (create, inspect, list, destroy; destroy is idempotent), a
// restarted driver finding running sandboxes, exec (streams, exit code,
// stdin, env, cwd, timeout and cancellation that kill the command's
// process group), that only fds 0-2 reach a command and never a file of the
// caller, PTY mode, background processes (survive execs, listed, logged,
// signalled to death and reaped; Wait returns exit codes and signals, after
// the end too and from a restarted driver, ErrNotFound for a pid Start did
// not make, and returns promptly on a cancelled context), files (every FS call; host writes seen
// inside at once and the other way round; tar round trip; Rename's
// semantics and refusals; a file in the sandbox's tmpfs), confinement of
// FS paths (traversal, absolute and relative symlinks planted by the
// sandbox, /proc magic links, writes through symlinks, tar escapes: none
// reaches a host file), each limit (memory hog, fork bomb, disk filler,
// CPU quota) with the host and a second sandbox still working, network
// isolation (no host service on loopback or a host address, no link-local
// metadata address, no other sandbox; TCP inside one sandbox works), and
// Kill (stopped, files kept).
//
// Every negative check is paired with a positive one that proves it could
// fail: the host server the sandbox must not reach answers the test
// itself; the memory hog succeeds in a sandbox whose limit allows it; the
// fork bomb's own errors show the limit was hit.
//
// # Cleanup
//
// Each sandbox is destroyed in t.Cleanup (also when the test fails). The
// last subtest checks that nothing is left on the host for any id the
// suite used: no mount point, cgroup directory or process whose command
// line names it, nothing the driver's List or Inspect still report, and
// whatever Options.Leftovers says.
package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Options configure Run.
type Options struct {
	// MinimalTemplate is a busybox template (see the package doc).
	MinimalTemplate sandbox.Template
	// CPUUsage, if set, returns the CPU time the host has charged to
	// sandbox id so far (e.g. its cpuacct cgroup's usage). The CPU test
	// then measures with it; without it, it reads the busy process's
	// utime+stime inside the sandbox, which is right on a Linux kernel
	// but not under gVisor (its task times include time the host
	// throttled the sandbox: 0.81 CPU reported for 0.40 used, measured).
	CPUUsage func(id string) (time.Duration, error)
	// Leftovers, if set, lists what the driver still keeps on the host
	// for id (runtime state, files) after Destroy; anything listed fails
	// the final check.
	Leftovers func(id string) []string
}

// Run runs the suite. newDriver returns a driver over the same host state
// every time it is called, as a restarted daemon would find it; the suite
// calls it once to begin with and again to check that a new driver finds
// running sandboxes.
func Run(t *testing.T, newDriver func(t *testing.T) sandbox.Driver, opts Options) {
	if os.Geteuid() != 0 {
		t.Skip("sandboxtest needs root")
	}
	if opts.MinimalTemplate.RootFS == "" {
		t.Fatal("sandboxtest: Options.MinimalTemplate.RootFS is empty")
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	s := &suite{
		d:         newDriver(t),
		newDriver: newDriver,
		opts:      opts,
		prefix:    "st" + hex.EncodeToString(rnd[:]),
	}
	// Registered first, so it runs after every subtest's cleanup.
	t.Cleanup(func() { s.destroyAll(t) })

	t.Run("Check", s.testCheck)
	t.Run("Lifecycle", s.testLifecycle)
	t.Run("PrefixIDs", s.testPrefixIDs)
	t.Run("Reattach", s.testReattach)
	t.Run("Group", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(*testing.T)
		}{
			{"Exec", s.testExec},
			{"ExecTimeout", s.testExecTimeout},
			{"ExecFDs", s.testExecFDs},
			{"TTY", s.testTTY},
			{"Background", s.testBackground},
			{"Files", s.testFiles},
			{"Confinement", s.testConfinement},
			{"MemoryLimit", s.testMemoryLimit},
			{"PidsLimit", s.testPidsLimit},
			{"DiskLimit", s.testDiskLimit},
			{"Network", s.testNetwork},
			{"Kill", s.testKill},
			// Last: with two tests at a time (2 cores), a subtest
			// added earlier in the list changes which tests run
			// together; MemoryLimit's Inspect after the OOM kill
			// races gVisor's notice of the sandbox's death when it
			// runs beside PidsLimit's fork bomb.
			{"Wait", s.testWait},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t)
			})
		}
	})
	// Timing-sensitive: alone, after the parallel group.
	t.Run("CPULimit", s.testCPULimit)
	t.Run("NoLeftovers", s.testNoLeftovers)
}

type suite struct {
	d         sandbox.Driver
	newDriver func(*testing.T) sandbox.Driver
	opts      Options
	prefix    string

	mu  sync.Mutex
	ids []string
}

// Time bounds. Generous: the host may be busy, but nothing may hang.
const (
	createTimeout  = 2 * time.Minute
	destroyTimeout = 2 * time.Minute
	execTimeout    = 90 * time.Second
	callTimeout    = time.Minute
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var nonID = regexp.MustCompile(`[^a-z0-9-]+`)

// newID returns a fresh sandbox id for a test (recorded for the final
// leftover check).
func (s *suite) newID(name string) string {
	var rnd [2]byte
	_, _ = rand.Read(rnd[:])
	id := s.prefix + hex.EncodeToString(rnd[:]) + "-" + nonID.ReplaceAllString(strings.ToLower(name), "-")
	if len(id) > 48 {
		id = id[:48]
	}
	id = strings.TrimRight(id, "-")
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
	return id
}

// create makes a sandbox from the minimal template with lim and destroys
// it when the test ends (registered before Create, so a failed create is
// cleaned up too).
func (s *suite) create(t *testing.T, name string, lim sandbox.Limits) string {
	t.Helper()
	id := s.newID(name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
		defer cancel()
		if err := s.d.Destroy(ctx, id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	})
	start := time.Now()
	info, err := s.d.Create(ctxFor(t, createTimeout), sandbox.Spec{ID: id, Template: s.opts.MinimalTemplate, Limits: lim})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	if info.ID != id || info.State != sandbox.StateRunning {
		t.Fatalf("create %s returned %+v, want it running", id, info)
	}
	t.Logf("created %s in %v", id, time.Since(start).Round(time.Millisecond))
	return id
}

// result is what one exec produced.
type result struct {
	sandbox.ExitStatus
	Stdout, Stderr string
}

// exec runs spec in id with the suite's default bounds.
func (s *suite) exec(t *testing.T, id string, spec sandbox.ExecSpec) (result, error) {
	t.Helper()
	var out, errb lockedBuffer
	if spec.Stdout == nil {
		spec.Stdout = &out
	}
	if spec.Stderr == nil && !spec.TTY {
		spec.Stderr = &errb
	}
	if spec.Timeout == 0 {
		spec.Timeout = execTimeout - 10*time.Second
	}
	st, err := s.d.Exec(ctxFor(t, execTimeout), id, spec)
	return result{ExitStatus: st, Stdout: out.String(), Stderr: errb.String()}, err
}

// sh runs a shell script in id and fails the test unless it exits 0. It
// returns stdout.
func (s *suite) sh(t *testing.T, id, script string) string {
	t.Helper()
	r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec in %s: %q: %v", id, script, err)
	}
	if r.Code != 0 {
		t.Fatalf("exec in %s: %q: exit %+v\nstdout: %s\nstderr: %s", id, script, r.ExitStatus, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// shStatus runs a shell script and returns its result without judging it.
func (s *suite) shStatus(t *testing.T, id, script string) result {
	t.Helper()
	r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec in %s: %q: %v", id, script, err)
	}
	return r
}

func (s *suite) files(t *testing.T, id string) sandbox.FS {
	t.Helper()
	fs, err := s.d.Files(ctxFor(t, callTimeout), id)
	if err != nil {
		t.Fatalf("files of %s: %v", id, err)
	}
	return fs
}

func readFile(t *testing.T, fs sandbox.FS, p string) (string, error) {
	t.Helper()
	var b bytes.Buffer
	err := fs.ReadFile(ctxFor(t, callTimeout), p, &b)
	return b.String(), err
}

func writeFile(t *testing.T, fs sandbox.FS, p, content string, mode os.FileMode) {
	t.Helper()
	if err := fs.WriteFile(ctxFor(t, callTimeout), p, strings.NewReader(content), mode); err != nil {
		t.Fatalf("write %s: %v", p, err)
	}
}

// eventually polls cond every 50ms until it returns "" or d passes; it
// fails the test with cond's last message.
func eventually(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func randToken(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes a driver
// may do from two copying goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var _ io.Writer = (*lockedBuffer)(nil)

// destroyAll destroys every id the suite made (they are normally gone
// already; this catches a test that died between create and cleanup).
func (s *suite) destroyAll(t *testing.T) {
	s.mu.Lock()
	ids := append([]string(nil), s.ids...)
	s.mu.Unlock()
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
		if err := s.d.Destroy(ctx, id); err != nil {
			t.Errorf("final destroy %s: %v", id, err)
		}
		cancel()
	}
}

func (s *suite) testCheck(t *testing.T) {
	if s.d.Name() == "" {
		t.Error("Name is empty")
	}
	if err := s.d.Check(ctxFor(t, 2*time.Minute)); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// testNoLeftovers: after every test's Destroy, nothing of any id remains.
func (s *suite) testNoLeftovers(t *testing.T) {
	s.mu.Lock()
	ids := append([]string(nil), s.ids...)
	s.mu.Unlock()
	if len(ids) == 0 {
		t.Skip("no sandbox was made")
	}
	ctx := ctxFor(t, callTimeout)
	list, err := s.d.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, info := range list {
		if strings.HasPrefix(info.ID, s.prefix) {
			t.Errorf("List still has %+v", info)
		}
	}
	for _, id := range ids {
		if info, err := s.d.Inspect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Inspect(%s) after destroy: %+v, %v; want not found", id, info, err)
		}
		if s.opts.Leftovers != nil {
			for _, l := range s.opts.Leftovers(id) {
				t.Errorf("%s: driver left %s", id, l)
			}
		}
	}
	for _, l := range hostLeftovers(s.prefix) {
		t.Errorf("left on the host: %s", l)
	}
}

// hostLeftovers finds mounts, cgroups and processes that name an id with
// the suite's prefix.
func hostLeftovers(prefix string) []string {
	var out []string
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, prefix) {
				out = append(out, "mount: "+line)
			}
		}
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		_ = filepath.WalkDir(h, func(p string, de os.DirEntry, err error) error {
			if err != nil || !de.IsDir() {
				return nil
			}
			if strings.Count(strings.TrimPrefix(p, h), "/") > 6 {
				return filepath.SkipDir
			}
			if strings.Contains(de.Name(), prefix) {
				out = append(out, "cgroup: "+p)
				return filepath.SkipDir
			}
			return nil
		})
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	self := fmt.Sprintf("/proc/%d/", os.Getpid())
	for _, p := range procs {
		if strings.HasPrefix(p, self) {
			continue
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(prefix)) {
			out = append(out, fmt.Sprintf("process %s: %s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	return out
}
