package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// runtimeFlags are the runsc flags every sandbox runs with. They are
// recorded in sandbox.json so that a later restore (runsc restore) boots
// the sandbox with the flags it was checkpointed with. The reasons for each
// are in the package doc.
var runtimeFlags = []string{
	"--platform=systrap",
	"--network=sandbox",
	"--overlay2=none",
	"--file-access=shared",
	"--host-uds=none",
	"--host-fifo=none",
}

// command returns an exec.Cmd for runsc with args, in its own process group
// (a signal meant for the daemon's group does not reach it) and with an
// environment of its own (the daemon's is not the sandbox's business).
// stdin/stdout/stderr are /dev/null unless the caller sets them.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	d.countRunsc(args)
	cmd := exec.CommandContext(ctx, d.runsc, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// globalFlags are the flags before a runsc subcommand for sandbox rec.
func (d *Driver) globalFlags(rec *record, logFile string) []string {
	args := []string{"--root=" + d.root}
	if logFile != "" {
		args = append(args, "--log="+logFile)
	}
	if rec != nil && len(rec.RunscFlags) > 0 {
		return append(args, rec.RunscFlags...)
	}
	return append(args, d.flags...)
}

// runsc runs a short runsc subcommand (not exec) for sandbox rec and
// returns its stdout. runsc reports its own errors on stderr and, as JSON,
// in the --log file; the error returned quotes them.
func (d *Driver) run(ctx context.Context, rec *record, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := d.command(ctx, append(d.globalFlags(rec, ""), args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 && len(msg) > 2000 {
			msg = msg[i+1:]
		}
		return stdout.Bytes(), &runscError{args: args, err: err, msg: msg}
	}
	return stdout.Bytes(), nil
}

// runscError is a failed runsc invocation.
type runscError struct {
	args []string
	err  error
	msg  string
}

func (e *runscError) Error() string {
	sub := ""
	if len(e.args) > 0 {
		sub = e.args[0]
	}
	if e.msg == "" {
		return fmt.Sprintf("runsc %s: %v", sub, e.err)
	}
	return fmt.Sprintf("runsc %s: %s", sub, e.msg)
}

func (e *runscError) Unwrap() error { return e.err }

// notExist reports whether err says runsc does not know the container.
func notExist(err error) bool {
	var re *runscError
	if !errors.As(err, &re) {
		return false
	}
	// "FetchSpec failed: loading container: file does not exist"
	return strings.Contains(re.msg, "loading container: file does not exist")
}

// runtimeIDSuffix ends every container id we give runsc. runsc resolves a
// container id that matches no container exactly as a prefix of one
// ("abbreviated id"), so "sbx-1" would reach "sbx-10" once "sbx-1" is
// gone, and while both exist "sbx-1" is "ambiguous". With a suffix outside
// the sandbox id alphabet ([a-z0-9-]), no runsc id is a prefix of another.
const runtimeIDSuffix = "_"

// runtimeID is the runsc container id of sandbox id.
func runtimeID(id string) string { return id + runtimeIDSuffix }

// containerState is the JSON of `runsc state` and `runsc list --format=json`.
type containerState struct {
	ID     string `json:"id"`
	Status string `json:"status"` // creating, created, running, paused, stopped
	Pid    int    `json:"pid"`
}

// state asks runsc about container id; ok is false when runsc has no such
// container.
func (d *Driver) state(ctx context.Context, rec *record, id string) (st containerState, ok bool, err error) {
	out, err := d.run(ctx, rec, "state", runtimeID(id))
	if err != nil {
		if notExist(err) {
			return st, false, nil
		}
		return st, false, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, false, fmt.Errorf("runsc state %s: %w", id, err)
	}
	st = deadIfZombie(st)
	return st, true, nil
}

// deadIfZombie corrects runsc's "running" for a sandbox whose process has
// exited but not been reaped: runsc tells a live sandbox by kill(pid, 0),
// which a zombie answers too. A sandbox process outlives the runsc call
// that forked it, so its parent is whoever adopts orphans — an init that
// does not reap (a container's PID 1, this machine's) leaves it a zombie
// for good, and a killed sandbox would never be seen stopped (Kill and
// Restore waited 10 s, then failed as unavailable). It is reaped here if
// it is this process's child (a daemon run as a subreaper or as PID 1).
func deadIfZombie(st containerState) containerState {
	if st.Pid <= 0 || st.Status != "running" && st.Status != "paused" && st.Status != "created" {
		return st
	}
	if !zombieOrGone(st.Pid) {
		return st
	}
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(st.Pid, &ws, syscall.WNOHANG, nil) // ECHILD unless ours
	st.Status = "stopped"
	return st
}

// zombieOrGone tells whether pid has exited (a zombie, or no such process).
func zombieOrGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command, which is in parentheses and may hold
	// any byte: take the field after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}

// list returns runsc's view of every container under our root, by id.
func (d *Driver) list(ctx context.Context) (map[string]containerState, error) {
	out, err := d.run(ctx, nil, "list", "--format=json")
	if err != nil {
		return nil, err
	}
	var sts []containerState
	if len(bytes.TrimSpace(out)) > 0 && !bytes.Equal(bytes.TrimSpace(out), []byte("null")) {
		if err := json.Unmarshal(out, &sts); err != nil {
			return nil, fmt.Errorf("runsc list: %w", err)
		}
	}
	m := make(map[string]containerState, len(sts))
	for _, s := range sts {
		if id, ok := strings.CutSuffix(s.ID, runtimeIDSuffix); ok {
			m[id] = deadIfZombie(s)
		}
	}
	return m, nil
}

// logMessages returns the error messages runsc wrote as JSON lines to its
// --log file (util.Errorf/Fatalf do), or nil when it wrote none.
func logMessages(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var msgs []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var m struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(line, &m) == nil && m.Msg != "" {
			msgs = append(msgs, m.Msg)
		} else {
			msgs = append(msgs, string(line))
		}
	}
	return msgs
}

// removeRuntimeState removes what runsc keeps under its root for id, for
// a container runsc itself can no longer delete (its files are named
// "<id>_sandbox:<sandbox id>.state|.lock" and "runsc-<id>.sock").
func (d *Driver) removeRuntimeState(id string) error {
	var errs []error
	rid := runtimeID(id)
	for _, pat := range []string{rid + "_sandbox:*", "runsc-" + rid + ".sock"} {
		m, _ := filepath.Glob(filepath.Join(d.root, pat))
		for _, p := range m {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// runtimeStateExists reports whether runsc keeps state for id.
func (d *Driver) runtimeStateExists(id string) bool {
	m, _ := filepath.Glob(filepath.Join(d.root, runtimeID(id)+"_sandbox:*"))
	return len(m) > 0
}

// classify turns a runsc failure for sandbox id into an error kind.
func classify(id string, err error) error {
	if err == nil {
		return nil
	}
	var re *runscError
	if errors.As(err, &re) {
		m := re.msg
		switch {
		case notExist(err):
			return fmt.Errorf("sandbox %s: %w: %v", id, errdefs.ErrNotFound, err)
		case strings.Contains(m, "is not running") || strings.Contains(m, "not running") ||
			strings.Contains(m, "stopped") || strings.Contains(m, "EOF"):
			return fmt.Errorf("sandbox %s is not running: %w: %v", id, errdefs.ErrFailedPrecondition, err)
		}
	}
	return fmt.Errorf("sandbox %s: %w", id, err)
}
