package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

func (s *suite) testExec(t *testing.T) {
	id := s.create(t, "exec", sandbox.Limits{})

	t.Run("Streams", func(t *testing.T) {
		r, err := s.exec(t, id, sandbox.ExecSpec{
			Args:  []string{"/bin/sh", "-c", `echo "out:$FOO:$(pwd)"; echo err >&2; cat; exit 3`},
			Env:   []string{"FOO=bar"},
			Cwd:   "/tmp",
			Stdin: strings.NewReader("from-stdin\n"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Code != 3 || r.Stdout != "out:bar:/tmp\nfrom-stdin\n" || r.Stderr != "err\n" {
			t.Errorf("got %+v stdout=%q stderr=%q", r.ExitStatus, r.Stdout, r.Stderr)
		}
	})
	t.Run("NoStdin", func(t *testing.T) {
		// No Stdin: the command reads EOF at once.
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "cat; echo eof"}, Timeout: 20 * time.Second})
		if err != nil || r.Code != 0 || r.Stdout != "eof\n" {
			t.Errorf("got %+v %v stdout=%q", r.ExitStatus, err, r.Stdout)
		}
	})
	t.Run("EnvOverrides", func(t *testing.T) {
		// The call's env wins over the sandbox's.
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", `echo "$PATH|$HOME"`}, Env: []string{"PATH=/bin:/x", "HOME=/h"}})
		if err != nil || r.Stdout != "/bin:/x|/h\n" {
			t.Errorf("got %q %v", r.Stdout, err)
		}
		// Without it, PATH finds the template's tools.
		r, err = s.exec(t, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "command -v wget"}})
		if err != nil || r.Code != 0 {
			t.Errorf("default PATH: %+v %v %q %q", r.ExitStatus, err, r.Stdout, r.Stderr)
		}
	})
	t.Run("ArgsVerbatim", func(t *testing.T) {
		args := []string{"printf", "[%s]", "a b", "", "--flag", "$HOME", "x\ny", "'q'"}
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: args})
		want := "[a b][][--flag][$HOME][x\ny]['q']"
		if err != nil || r.Stdout != want {
			t.Errorf("got %q %v, want %q", r.Stdout, err, want)
		}
	})
	t.Run("BigStreams", func(t *testing.T) {
		const n = 4 << 20
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", n)}})
		if err != nil || r.Code != 0 || len(r.Stdout) != n || strings.Trim(r.Stdout, "x") != "" {
			t.Errorf("stdout of %d bytes: got %d bytes, %+v %v", n, len(r.Stdout), r.ExitStatus, err)
		}
		in := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
		r, err = s.exec(t, id, sandbox.ExecSpec{Args: []string{"wc", "-c"}, Stdin: strings.NewReader(in)})
		if err != nil || strings.TrimSpace(r.Stdout) != fmt.Sprint(len(in)) {
			t.Errorf("stdin of %d bytes: wc says %q, %v", len(in), r.Stdout, err)
		}
	})
	t.Run("MissingCommand", func(t *testing.T) {
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/no/such/program"}, Timeout: 30 * time.Second})
		if err == nil && r.Code == 0 {
			t.Errorf("running a missing program succeeded")
		}
		t.Logf("missing program: %+v %v %q", r.ExitStatus, err, r.Stderr)
	})
	t.Run("ExitCodes", func(t *testing.T) {
		for _, code := range []int{0, 1, 42, 255} {
			r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", fmt.Sprintf("exit %d", code)}})
			if err != nil || r.Code != code {
				t.Errorf("exit %d: got %+v %v", code, r.ExitStatus, err)
			}
		}
	})
	t.Run("BackgroundChildKeepsStdout", func(t *testing.T) {
		// A child that keeps stdout open must not hold Exec.
		start := time.Now()
		r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "sleep 3134 & echo done"}, Timeout: 60 * time.Second})
		if err != nil || r.Code != 0 || r.Stdout != "done\n" || r.TimedOut {
			t.Errorf("got %+v %v %q", r.ExitStatus, err, r.Stdout)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("exec returned after %v, want it right after the shell exited", d)
		}
		s.sh(t, id, "kill $(pidof sleep) 2>/dev/null; true")
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out lockedBuffer
				st, err := s.d.Exec(ctxFor(t, execTimeout), id, sandbox.ExecSpec{
					Args: []string{"/bin/sh", "-c", fmt.Sprintf("echo %d; echo e%d >&2", i, i)}, Stdout: &out, Timeout: time.Minute})
				if err != nil || st.Code != 0 || out.String() != fmt.Sprintf("%d\n", i) {
					t.Errorf("concurrent exec %d: %+v %v %q", i, st, err, out.String())
				}
			}()
		}
		wg.Wait()
	})
}

// testExecTimeout: a timeout and a cancelled context each end the command
// and its process group, promptly.
func (s *suite) testExecTimeout(t *testing.T) {
	id := s.create(t, "timeout", sandbox.Limits{})
	gone := func(t *testing.T, needles ...string) {
		t.Helper()
		eventually(t, 10*time.Second, func() string {
			procs, err := s.d.Processes(ctxFor(t, callTimeout), id)
			if err != nil {
				return err.Error()
			}
			for _, p := range procs {
				for _, n := range needles {
					if slices.Contains(p.Args, n) {
						return fmt.Sprintf("process %+v still runs", p)
					}
				}
			}
			return ""
		})
	}

	start := time.Now()
	r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "sleep 3131 & sleep 3132"}, Timeout: time.Second})
	took := time.Since(start)
	if err != nil || !r.TimedOut {
		t.Fatalf("Timeout 1s: %+v %v, want TimedOut", r.ExitStatus, err)
	}
	if took > 15*time.Second {
		t.Errorf("Timeout 1s returned after %v", took)
	}
	t.Logf("timed out after %v: %+v", took.Round(time.Millisecond), r.ExitStatus)
	gone(t, "3131", "3132")

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start = time.Now()
	_, err = s.d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "sleep 3133 & sleep 3135"}})
	if err == nil {
		t.Errorf("Exec with a cancelled context returned no error")
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("cancelled Exec returned after %v", took)
	}
	gone(t, "3133", "3135")

	// The sandbox still works.
	if out := s.sh(t, id, "echo ok"); out != "ok\n" {
		t.Errorf("after timeouts: %q", out)
	}
}

// testExecFDs: the command gets fds 0, 1 and 2 and nothing else, and they
// are never the caller's own files.
func (s *suite) testExecFDs(t *testing.T) {
	id := s.create(t, "fds", sandbox.Limits{})
	fdsOf := func(out string) []string { return strings.Fields(out) }
	check := func(t *testing.T, what string, fds []string) {
		t.Helper()
		for _, want := range []string{"0", "1", "2"} {
			if !slices.Contains(fds, want) {
				t.Errorf("%s: fd %s missing from %v", what, want, fds)
			}
		}
		for _, fd := range fds {
			// 3 is ls's own descriptor of /proc/self/fd.
			if !slices.Contains([]string{"0", "1", "2", "3"}, fd) {
				t.Errorf("%s: unexpected fd %s (all: %v)", what, fd, fds)
			}
		}
	}

	r, err := s.exec(t, id, sandbox.ExecSpec{Args: []string{"ls", "/proc/self/fd"}, Stdin: strings.NewReader("x")})
	if err != nil || r.Code != 0 {
		t.Fatalf("ls /proc/self/fd: %+v %v %q", r.ExitStatus, err, r.Stderr)
	}
	check(t, "exec", fdsOf(r.Stdout))

	// Host files given as stdin and stdout: the command must see pipes
	// (the driver copies), never the files themselves.
	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.WriteString("host-input\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	st, err := s.d.Exec(ctxFor(t, execTimeout), id, sandbox.ExecSpec{
		Args: []string{"/bin/sh", "-c",
			`for fd in 0 1 2; do if [ -f /proc/self/fd/$fd ]; then echo "fd$fd:regular-file"; else echo "fd$fd:ok"; fi; done; cat`},
		Stdin: in, Stdout: out, Stderr: out, Timeout: time.Minute,
	})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec with host files: %+v %v", st, err)
	}
	got, _ := os.ReadFile(out.Name())
	if string(got) != "fd0:ok\nfd1:ok\nfd2:ok\nhost-input\n" {
		t.Errorf("with host files as stdio the command saw:\n%s", got)
	}

	// A background process too.
	pid, err := s.d.Start(ctxFor(t, callTimeout), id, sandbox.ExecSpec{Args: []string{"ls", "/proc/self/fd"}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	fs := s.files(t, id)
	var log string
	eventually(t, 20*time.Second, func() string {
		log, err = readFile(t, fs, fmt.Sprintf("/run/amber/proc/%d.log", pid))
		if err != nil || !strings.Contains(log, "2") {
			return fmt.Sprintf("log of %d: %q %v", pid, log, err)
		}
		return ""
	})
	check(t, "background", fdsOf(log))
}

// testTTY: TTY mode gives the command a terminal on stdin and stdout, with
// stderr merged; without it there is none.
func (s *suite) testTTY(t *testing.T) {
	if !s.d.Capabilities().PTY {
		t.Skip("driver has no PTY mode")
	}
	id := s.create(t, "tty", sandbox.Limits{})
	r, err := s.exec(t, id, sandbox.ExecSpec{
		Args:  []string{"/bin/sh", "-c", `[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo IS-A-TTY; echo to-stderr >&2; read l; echo "got:$l"`},
		TTY:   true,
		Stdin: strings.NewReader("typed\n"),
	})
	if err != nil || r.Code != 0 {
		t.Fatalf("tty exec: %+v %v %q", r.ExitStatus, err, r.Stdout)
	}
	for _, want := range []string{"IS-A-TTY", "to-stderr", "got:typed"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("tty output %q lacks %q", r.Stdout, want)
		}
	}
	r, err = s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", `[ -t 0 ] || [ -t 1 ] || echo NO-TTY`}})
	if err != nil || r.Stdout != "NO-TTY\n" {
		t.Errorf("without TTY: %q %v", r.Stdout, err)
	}
	// The end of the caller's input is an end of file for the command.
	r, err = s.exec(t, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "cat; echo AFTER-EOF"}, TTY: true,
		Stdin: strings.NewReader("line\n"), Timeout: 30 * time.Second})
	if err != nil || r.TimedOut || !strings.Contains(r.Stdout, "AFTER-EOF") {
		t.Errorf("tty stdin EOF: %+v %v %q", r.ExitStatus, err, r.Stdout)
	}
	// A timed-out TTY command ends too.
	r, err = s.exec(t, id, sandbox.ExecSpec{Args: []string{"sleep", "3136"}, TTY: true, Timeout: time.Second})
	if err != nil || !r.TimedOut {
		t.Errorf("tty timeout: %+v %v", r.ExitStatus, err)
	}
}
