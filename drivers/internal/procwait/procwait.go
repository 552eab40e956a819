// Package procwait is what the isolation drivers share to give a background
// process (sandbox.Driver.Start) an exit status that Wait can return: the
// waiter, a shell script that runs inside the sandbox as the parent of the
// process and records how it ended in a file next to its log, and the
// host-side loop that reads that file.
//
// # Files
//
// For a process with sandbox PID n, in Dir (/run/amber/proc) inside the
// sandbox:
//
//	n.log    its stdout and stderr (the process opens it itself, as its
//	         first act, so that it is named after the PID it has)
//	n.exit   made empty by the waiter before Start returns n (so Wait can
//	         tell a process Start made from any other PID); when the
//	         process has ended, the shell status the waiter's `wait`
//	         returned, as one line: "0\n", "7\n", "137\n" (128+n: signal n)
//
// Both are in the sandbox's writable layer, not in the daemon: the status is
// recorded when the process ends even if no daemon watches, it survives a
// daemon restart, and a checkpoint captures it with the layer (a waiter still
// waiting is checkpointed and restored with its process, being part of the
// sandbox's process tree). Files read them from the host.
//
// # Why a shell waiter
//
// Only a process's parent learns its exit status. The drivers start
// background processes from inside the sandbox (the gvisor driver through the
// sandbox's init, the criu driver through an exec whose children are
// reparented to the init), and the template's /bin/sh is the one program every
// template has. The waiter uses shell built-ins only, so a PATH set by the
// template or the caller cannot break it.
//
// A shell reports a process killed by signal n as 128+n, as it reports a
// process that called exit(128+n): the two cannot be told apart here, and
// both are reported as the signal (see Parse). The waiter costs one shell
// process per background process, counted by the sandbox's pids limit.
package procwait

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Dir is the directory, inside a sandbox, of the logs and exit files of
// background processes.
const Dir = "/run/amber/proc"

// ShQuote quotes s for a POSIX shell.
func ShQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Script returns the waiter: a POSIX shell script to run with the command as
// its positional parameters ("$@"). It starts the command in the background
// as a new /bin/sh that points its stdio at dir/<its pid>.log, runs setup
// (shell code: the environment, the working directory) and execs the
// command, which so keeps that PID. The waiter then empties dir/<pid>.exit,
// runs report (shell code that finds the PID in $amber_c; it is 0 when the
// exit file cannot be written, and the command has been killed), waits for
// the command and writes its status to the exit file.
//
// The waiter's own variables are named amber_*, and are set only after the
// command was started, so that they do not reach its environment. Its
// statements are shell built-ins only (report aside), and none is a special
// built-in, whose failed redirection would end the shell. A status write is
// a single short write(2) into a file that already exists, empty: a reader
// sees either the empty file or the whole line.
func Script(dir, setup, report string) string {
	inner := `exec </dev/null >"` + dir + `/$$.log" 2>&1` + "\n" + setup + "exec \"$@\"\n"
	exit := `"` + dir + `/$amber_c.exit"`
	return `/bin/sh -c ` + ShQuote(inner) + ` amber-proc "$@" &
amber_c=$!
if ! true >` + exit + `; then kill -9 "$amber_c"; amber_c=0; fi
` + report + `
[ "$amber_c" != 0 ] || exit 1
wait "$amber_c"
echo "$?" >` + exit + "\n"
}

// Starting reports whether args, the command line of the PID Start
// returned, is still one of the shells that start the command rather than
// the command: the waiter's fork or the shell that opens the log (whose $0
// is "amber-proc", or "amber-wait" for a waiter the criu driver runs).
// Start waits until it is not, so that a Processes right after Start lists
// the command as started.
func Starting(args []string) bool {
	return len(args) >= 4 && args[1] == "-c" && (args[3] == "amber-proc" || args[3] == "amber-wait")
}

// ExitPath is the exit file of process pid.
func ExitPath(pid int) string { return fmt.Sprintf("%s/%d.exit", Dir, pid) }

// maxExitFile bounds what Wait reads of an exit file (the sandbox can write
// anything there).
const maxExitFile = 64

// Parse reads an exit file's content. ok is false while the process runs
// (the file is empty). A status of 128+n, n a signal number, is reported as
// that signal: Code 128+n and Signal its name ("SIGKILL"), as Exec reports
// a command it killed.
func Parse(b []byte) (st sandbox.ExitStatus, ok bool, err error) {
	if len(b) == 0 {
		return st, false, nil
	}
	line, rest, found := bytes.Cut(b, []byte("\n"))
	code, cerr := strconv.Atoi(string(line))
	if !found || len(rest) != 0 || cerr != nil || code < 0 || code > 255 {
		if len(b) > maxExitFile { // the sandbox wrote it: quote a prefix
			return st, false, fmt.Errorf("%q… (%d bytes) is not an exit status", b[:maxExitFile], len(b))
		}
		return st, false, fmt.Errorf("%q is not an exit status", b)
	}
	st.Code = code
	if code > 128 {
		if name := unix.SignalName(unix.Signal(code - 128)); name != "" {
			st.Signal = name
		}
	}
	return st, true, nil
}

// Options tune Wait. Zero values mean the defaults.
type Options struct {
	// Poll is how often the exit file is read (default 100ms).
	Poll time.Duration
	// CheckEvery is how often Alive is asked whether the process still
	// runs (default 2s; an exec in some drivers).
	CheckEvery time.Duration
	// Grace is how long after the process was seen gone the exit file
	// may still be empty (default 5s; the waiter writes it right after
	// reaping the process, but the host may be busy).
	Grace time.Duration
}

func (o Options) withDefaults() Options {
	if o.Poll <= 0 {
		o.Poll = 100 * time.Millisecond
	}
	if o.CheckEvery <= 0 {
		o.CheckEvery = 2 * time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	return o
}

// Alive reports whether process pid of the sandbox still exists (a zombie
// counts); it returns an error when the sandbox no longer runs.
type Alive func(ctx context.Context, pid int) (bool, error)

// Wait waits until process pid's exit file in fs holds a status and returns
// it. A PID without an exit file was not started by Start: ErrNotFound. When
// the process is gone but no status was recorded (its waiter was killed),
// Wait returns ErrDataLoss after Options.Grace. When ctx ends, Wait returns
// its error at once and leaves the process alone.
func Wait(ctx context.Context, fs sandbox.FS, pid int, alive Alive, o Options) (sandbox.ExitStatus, error) {
	o = o.withDefaults()
	if pid <= 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("wait: pid %d", pid)
	}
	path := ExitPath(pid)
	poll := time.NewTicker(o.Poll)
	defer poll.Stop()
	nextCheck := time.Now().Add(o.CheckEvery)
	var goneAt time.Time
	for first := true; ; first = false {
		st, done, err := readExit(ctx, fs, path)
		switch {
		case errdefs.IsNotFound(err) && first:
			return sandbox.ExitStatus{}, errdefs.NotFoundf("process %d: not started by Start (no %s)", pid, path)
		case errdefs.IsNotFound(err):
			return sandbox.ExitStatus{}, errdefs.DataLossf("process %d: %s was removed", pid, path)
		case err != nil:
			return sandbox.ExitStatus{}, ctxErr(ctx, pid, err)
		case done:
			return st, nil
		}
		now := time.Now()
		if !goneAt.IsZero() && now.Sub(goneAt) > o.Grace {
			return sandbox.ExitStatus{}, errdefs.DataLossf("process %d ended but no exit status was recorded in %s (its waiter was killed?)", pid, path)
		}
		if goneAt.IsZero() && !now.Before(nextCheck) {
			ok, err := alive(ctx, pid)
			if err != nil {
				return sandbox.ExitStatus{}, ctxErr(ctx, pid, err)
			}
			if !ok {
				goneAt = now
			}
			nextCheck = time.Now().Add(o.CheckEvery)
		}
		select {
		case <-ctx.Done():
			return sandbox.ExitStatus{}, ctxErr(ctx, pid, ctx.Err())
		case <-poll.C:
		}
	}
}

// ctxErr prefers ctx's own error when ctx has ended (a call that failed
// because of it says less).
func ctxErr(ctx context.Context, pid int, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("wait for process %d: %w", pid, ctx.Err())
	}
	return err
}

// readExit reads and parses an exit file.
func readExit(ctx context.Context, fs sandbox.FS, path string) (sandbox.ExitStatus, bool, error) {
	var b limitedBuffer
	if err := fs.ReadFile(ctx, path, &b); err != nil {
		if errors.Is(err, errTooLong) {
			return sandbox.ExitStatus{}, false, errdefs.DataLossf("%s: longer than %d bytes", path, maxExitFile)
		}
		if ctx.Err() != nil {
			return sandbox.ExitStatus{}, false, ctx.Err()
		}
		return sandbox.ExitStatus{}, false, err
	}
	st, ok, err := Parse(b.Bytes())
	if err != nil {
		return st, false, errdefs.DataLossf("%s: %v", path, err)
	}
	return st, ok, nil
}

var errTooLong = errors.New("exit file too long")

// limitedBuffer refuses to grow past maxExitFile bytes.
type limitedBuffer struct{ bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.Len()+len(p) > maxExitFile {
		return 0, errTooLong
	}
	return l.Buffer.Write(p)
}
