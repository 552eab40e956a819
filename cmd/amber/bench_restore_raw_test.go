package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine/enginetest"
)

// The raw runtimes of TestBenchRestore: runsc and runc (with the cache's
// CRIU, eager and with lazy pages), driven by their own CLIs on a bundle
// of nothing but the ticker, images on the same filesystem as Amber's.
// Each container's stdout is a pipe this process reads (runc hands a
// restored process its restore command's stdio when the cut's were pipes).

// rawStack is what both raw runtimes share: the bundle, the image and work
// directories, and the output read from each incarnation's pipe.
type rawStack struct {
	t      *testing.T
	label  string
	dir    string // bundle (config.json, rootfs), images, work
	ticker string
	id     string
	cgroup string
	round  int
	mu     sync.Mutex
	out    bytes.Buffer
	// run runs one runtime command with the container's stdout (nil:
	// /dev/null); it returns once the command returned.
	run func(stdout *os.File, args ...string) error
}

func (r *rawStack) name() string { return r.label }

func (r *rawStack) image() string { return filepath.Join(r.dir, fmt.Sprintf("image-%d", r.round)) }
func (r *rawStack) work() string  { return filepath.Join(r.dir, fmt.Sprintf("work-%d", r.round)) }

// withPipe runs a runtime command whose container writes to a new pipe
// that this process reads to the end.
func (r *rawStack) withPipe(args ...string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			r.mu.Lock()
			r.out.Write(buf[:n])
			r.mu.Unlock()
			if err != nil {
				pr.Close()
				return
			}
		}
	}()
	err = r.run(pw, args...)
	pw.Close()
	if err != nil {
		// The runtime's own complaint went to the pipe.
		out, _ := r.output()
		return fmt.Errorf("%w: %s", err, tail(out, 5))
	}
	return nil
}

func (r *rawStack) output() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String(), nil
}

// bundle writes config.json (from the runtime's own `spec`) for the ticker
// over size MiB, in the cgroup r.cgroup.
func (r *rawStack) bundle(specCmd []string, size int) error {
	rootfs := filepath.Join(r.dir, "rootfs")
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(r.ticker)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "ticker"), b, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(r.dir, "config.json"))
	cmd := exec.Command(specCmd[0], append(specCmd[1:], "--bundle", r.dir)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(specCmd, " "), err, out)
	}
	var spec map[string]any
	if b, err = os.ReadFile(filepath.Join(r.dir, "config.json")); err != nil {
		return err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/ticker", strconv.Itoa(size), strconv.FormatUint(rand.Uint64()|1, 10)}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": false}
	spec["linux"].(map[string]any)["cgroupsPath"] = r.cgroup
	if b, err = json.MarshalIndent(spec, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dir, "config.json"), b, 0o644)
}

// started waits for the ticker's first line.
func (r *rawStack) started() error {
	_, err := waitOutput(r, 5*time.Minute, func(o string) bool { return strings.Contains(o, "ready ") })
	return err
}

func (r *rawStack) prepareCut() error {
	r.round++
	for _, d := range []string{r.image(), r.work()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	// The round before's image is not needed again.
	_ = os.RemoveAll(filepath.Join(r.dir, fmt.Sprintf("image-%d", r.round-1)))
	_ = os.RemoveAll(filepath.Join(r.dir, fmt.Sprintf("work-%d", r.round-1)))
	return nil
}

// runtimeCmd runs bin with args; stdout (the container's, for run and
// restore) may be nil.
func runtimeCmd(env []string, bin string, stdout *os.File, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	// A file, not a buffer: a detached container keeps its stderr, and
	// Wait would wait for a pipe's copier until the container ends.
	errf, err := os.CreateTemp("", "amber-bench-stderr-")
	if err != nil {
		return err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	cmd.Stderr = errf
	if stdout != nil {
		// The container's stderr too: CRIU cannot dump a file it
		// cannot find in the container (the temporary file above).
		cmd.Stdout, cmd.Stderr = stdout, stdout
	}
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(errf.Name())
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, tail(string(b), 5))
	}
	return nil
}

// rawRunsc is runsc alone, with the gvisor driver's file flags and no
// network (the driver's --network=sandbox needs the namespace Amber makes);
// background: `runsc restore --background` (the sandbox runs before every
// page is in), runsc's own lazy restore.
type rawRunsc struct {
	rawStack
	bin        string
	flags      []string
	background bool
}

func newRawRunsc(t *testing.T, dir, ticker string, background bool) *rawRunsc {
	r := &rawRunsc{bin: filepath.Join(enginetest.Cache(), "bin", "runsc"), background: background}
	label := map[bool]string{false: "runsc", true: "runsc-bg"}[background]
	r.rawStack = rawStack{t: t, label: label, dir: filepath.Join(dir, "raw-"+label), ticker: ticker}
	r.flags = []string{"--root=" + filepath.Join(r.dir, "root"), "--platform=systrap", "--network=none",
		"--overlay2=none", "--file-access=shared", "--host-uds=none", "--host-fifo=none"}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	r.run = func(stdout *os.File, args ...string) error {
		return runtimeCmd(env, r.bin, stdout, append(append([]string{}, r.flags...), args...)...)
	}
	t.Cleanup(r.stop)
	return r
}

func (r *rawRunsc) start(size int) error {
	r.stop()
	r.id = fmt.Sprintf("bench-runsc-%d", time.Now().UnixNano())
	r.cgroup = "/amber-bench/" + r.id
	r.out.Reset()
	if err := r.bundle([]string{r.bin, "spec"}, size); err != nil {
		return err
	}
	if err := r.withPipe("run", "--detach", "--bundle", r.dir, r.id); err != nil {
		return err
	}
	return r.started()
}

func (r *rawRunsc) cut() error {
	if err := r.prepareCut(); err != nil {
		return err
	}
	return r.run(nil, "checkpoint", "--image-path="+r.image(), "--leave-running", r.id)
}

// kill ends the container (runsc's sandbox process stays until delete).
func (r *rawRunsc) kill() error {
	if err := cgroupHolds(r.cgroup); err != nil {
		return err
	}
	if err := r.run(nil, "kill", r.id, "KILL"); err != nil {
		return err
	}
	if err := r.run(nil, "delete", "--force", r.id); err != nil {
		return err
	}
	return cgroupEmpty(r.cgroup)
}

func (r *rawRunsc) restore() error {
	args := []string{"restore", "--detach", "--image-path=" + r.image(), "--bundle", r.dir, r.id}
	if r.background {
		args = slices.Insert(args, 2, "--background")
	}
	return r.withPipe(args...)
}

func (r *rawRunsc) signal() error { return r.run(nil, "kill", r.id, "USR1") }

func (r *rawRunsc) stop() {
	if r.id == "" {
		return
	}
	_ = r.run(nil, "delete", "--force", r.id)
	_ = cgroupEmpty(r.cgroup)
	r.id = ""
}

// rawRunc is runc with the cache's CRIU (the criu driver's), eager or, with
// lazy, restoring through `criu lazy-pages` (which the patched CRIU lets
// open /dev/userfaultfd).
type rawRunc struct {
	rawStack
	bin, criu string
	lazy      bool
	env       []string
	pages     *exec.Cmd // the lazy-pages daemon of the last restore
}

func newRawRunc(t *testing.T, dir, ticker string, lazy bool) *rawRunc {
	bin, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("the runc stacks need runc (make bench-restore installs Debian's): %v", err)
	}
	label := "runc"
	if lazy {
		label = "runc-lazy"
	}
	r := &rawRunc{bin: bin, criu: filepath.Join(enginetest.Cache(), "bin", "criu"), lazy: lazy}
	r.rawStack = rawStack{t: t, label: label, dir: filepath.Join(dir, "raw-"+label), ticker: ticker}
	// runc runs the CRIU it finds on PATH: the cache's first.
	r.env = []string{"PATH=" + filepath.Join(enginetest.Cache(), "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	r.run = func(stdout *os.File, args ...string) error {
		return runtimeCmd(r.env, r.bin, stdout, append([]string{"--root", filepath.Join(r.dir, "root")}, args...)...)
	}
	t.Cleanup(r.stop)
	return r
}

func (r *rawRunc) start(size int) error {
	r.stop()
	r.id = fmt.Sprintf("bench-%s-%d", r.label, time.Now().UnixNano())
	r.cgroup = "/amber-bench/" + r.id
	r.out.Reset()
	if err := r.bundle([]string{r.bin, "spec"}, size); err != nil {
		return err
	}
	if err := r.withPipe("run", "--detach", "--bundle", r.dir, r.id); err != nil {
		return err
	}
	return r.started()
}

func (r *rawRunc) cut() error {
	if err := r.prepareCut(); err != nil {
		return err
	}
	if err := r.run(nil, "checkpoint", "--image-path", r.image(), "--work-path", r.work(), "--leave-running", r.id); err != nil {
		b, _ := os.ReadFile(filepath.Join(r.work(), "dump.log"))
		return fmt.Errorf("%w\ndump.log: %s", err, grepErrors(string(b)))
	}
	return nil
}

func (r *rawRunc) kill() error {
	if err := cgroupHolds(r.cgroup); err != nil {
		return err
	}
	if err := r.run(nil, "kill", r.id, "KILL"); err != nil {
		return err
	}
	if err := cgroupEmpty(r.cgroup); err != nil {
		return err
	}
	r.endPages()
	return r.run(nil, "delete", "--force", r.id)
}

func (r *rawRunc) restore() error {
	args := []string{"restore", "--detach", "--image-path", r.image(), "--work-path", r.work(), "--bundle", r.dir}
	if r.lazy {
		// The page daemon serves the image's pages on first touch; it
		// listens on a socket in the work directory, which the restore
		// finds there.
		r.pages = exec.Command(r.criu, "lazy-pages", "--images-dir", r.image(), "--work-dir", r.work())
		r.pages.Env = r.env
		r.pages.Stdout, r.pages.Stderr = io.Discard, io.Discard
		if err := r.pages.Start(); err != nil {
			return err
		}
		sock := filepath.Join(r.work(), "lazy-pages.socket")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("criu lazy-pages made no %s within 10s", sock)
			}
		}
		args = append(args, "--lazy-pages")
	}
	return r.withPipe(append(args, r.id)...)
}

// endPages waits for the last restore's page daemon (it exits once every
// page is in) or ends it, by the PID this process started.
func (r *rawRunc) endPages() {
	if r.pages == nil {
		return
	}
	done := make(chan struct{})
	go func() { r.pages.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = r.pages.Process.Kill()
		<-done
	}
	r.pages = nil
}

func (r *rawRunc) signal() error { return r.run(nil, "kill", r.id, "USR1") }

func (r *rawRunc) stop() {
	if r.id == "" {
		return
	}
	_ = r.run(nil, "kill", r.id, "KILL")
	_ = cgroupEmpty(r.cgroup)
	r.endPages()
	_ = r.run(nil, "delete", "--force", r.id)
	r.id = ""
}

// grepErrors is the lines of a CRIU log that report an error.
func grepErrors(log string) string {
	var out []string
	for l := range strings.Lines(log) {
		if strings.Contains(l, "Error") || strings.Contains(l, "rror (") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}
