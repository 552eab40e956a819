package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/lib/agentproto"
)

// drainGrace is how long after a process ended its exit frame waits for
// output still in its pipes, held open by descendants (`cmd &`).
const drainGrace = 200 * time.Millisecond

// keepExited is how many ended processes the table remembers (their exit
// status and ring), oldest forgotten first.
const keepExited = 512

// table is every process the agent started. The reaper and Start take its
// lock around wait4 and fork+register, so a status is never reaped for a
// PID the table does not know yet.
type table struct {
	mu     sync.Mutex
	procs  map[int]*proc
	exited []int // in order of ending

	keys     map[string]int // Start.Key → pid, the newest keepKeys
	keyOrder []string
}

// keepKeys is how many start keys the table remembers.
const keepKeys = 4096

func newTable() *table { return &table{procs: map[int]*proc{}, keys: map[string]int{}} }

// started returns the process a start with key made, if one did.
func (t *table) started(key string) (*proc, bool) {
	if key == "" {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	pid, ok := t.keys[key]
	if !ok {
		return nil, false
	}
	p, ok := t.procs[pid]
	return p, ok
}

// rememberKey records key → pid; t.mu held.
func (t *table) rememberKey(key string, pid int) {
	if key == "" {
		return
	}
	t.keys[key] = pid
	t.keyOrder = append(t.keyOrder, key)
	for len(t.keyOrder) > keepKeys {
		delete(t.keys, t.keyOrder[0])
		t.keyOrder = t.keyOrder[1:]
	}
}

// proc is one started process.
type proc struct {
	pid  int
	tty  *os.File // the pseudo-terminal's master, TTY mode
	logf *os.File // LogDir/<pid>.log, Log mode

	mu       sync.Mutex
	ring     *ring
	stdin    *os.File // nil once closed
	open     int      // output pipes not yet at end of file
	exit     *agentproto.Exit
	exitAt   time.Time
	forkAt   time.Time // just before the fork: Exit.LifeMicros
	finished bool      // exit recorded and output complete (done): the exit file is written
	timedOut bool
	changed  chan struct{} // closed and replaced on every change

	// hold: an attached command (Start.Hold). Its output is not dropped
	// from the ring before a follower has read it: copyOut waits, and so
	// the process waits on its full pipe, as behind a pipe to a slow
	// reader. followers counts the attached output streams; read is the
	// furthest offset one of them has written out; detached is when the
	// last one went away (after holdGrace without one, output is dropped
	// again rather than stopping the process for good).
	hold      bool
	followers int
	read      int64
	detached  time.Time
	waiting   int // copyOut goroutines waiting for room (held output)
}

// holdGrace is how long a held process's output waits for a follower to
// come back (a client re-attaching after a dropped connection).
const holdGrace = 30 * time.Second

// mayWrite reports whether n more bytes fit without dropping output no
// follower has read; p.mu held.
func (p *proc) mayWrite(n int) bool {
	if !p.hold {
		return true
	}
	if p.followers == 0 && !p.detached.IsZero() && time.Since(p.detached) > holdGrace {
		return true
	}
	return p.ring.end+int64(n)-p.read <= int64(p.ring.cap)
}

// notify wakes every reader; p.mu held.
func (p *proc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

var errNotFound = errors.New("not found")

func (t *table) get(pid int) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return nil, fmt.Errorf("process %d: %w", pid, errNotFound)
	}
	return p, nil
}

// start starts s as a child of the agent, leader of a new session.
func (t *table) start(s agentproto.Start) (*proc, error) {
	argv := s.Args
	if s.Shell != "" {
		argv = []string{"/bin/sh", "-c", s.Shell}
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("%w: no command", errInvalid)
	}
	path, err := lookPath(argv[0], s.Env)
	if err != nil {
		return nil, err
	}
	if s.Cwd == "" || s.Cwd[0] != '/' {
		return nil, fmt.Errorf("%w: cwd %q is not absolute", errInvalid, s.Cwd)
	}
	if fi, err := os.Stat(s.Cwd); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: initial working directory %q is not a directory", errInvalid, s.Cwd)
	}
	ringCap := s.RingBytes
	if ringCap <= 0 {
		ringCap = agentproto.DefaultRing
	}
	if ringCap > agentproto.MaxRing {
		ringCap = agentproto.MaxRing
	}
	p := &proc{ring: newRing(ringCap), changed: make(chan struct{}), hold: s.Hold, detached: time.Now()}
	var (
		childFiles []*os.File // the child's ends, closed here after the fork
		readers    []struct {
			f    *os.File
			kind agentproto.FrameKind
		}
	)
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
	}()
	fail := func(err error) (*proc, error) {
		for _, r := range readers {
			r.f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		if p.tty != nil {
			p.tty.Close()
		}
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setsid: true}
	if s.UID != uint32(os.Getuid()) || s.GID != uint32(os.Getgid()) {
		attr.Credential = &syscall.Credential{Uid: s.UID, Gid: s.GID, NoSetGroups: false}
	}
	var fds [3]uintptr
	if s.TTY {
		m, sl, err := openPTY(s.Rows, s.Cols)
		if err != nil {
			return fail(fmt.Errorf("pty: %w", err))
		}
		p.tty = m
		childFiles = append(childFiles, sl)
		fds = [3]uintptr{sl.Fd(), sl.Fd(), sl.Fd()}
		attr.Setctty = true
		attr.Ctty = 0
		readers = append(readers, struct {
			f    *os.File
			kind agentproto.FrameKind
		}{m, agentproto.Stdout})
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		childFiles = append(childFiles, inR)
		if s.Stdin {
			p.stdin = inW
		} else {
			inW.Close()
		}
		fds[0] = inR.Fd()
		for i, kind := range []agentproto.FrameKind{agentproto.Stdout, agentproto.Stderr} {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(err)
			}
			childFiles = append(childFiles, w)
			fds[1+i] = w.Fd()
			readers = append(readers, struct {
				f    *os.File
				kind agentproto.FrameKind
			}{r, kind})
		}
	}
	t.mu.Lock()
	p.forkAt = time.Now()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Dir: s.Cwd, Env: s.Env, Files: fds[:], Sys: attr})
	if err != nil {
		t.mu.Unlock()
		return fail(execError(argv[0], err))
	}
	p.pid = pid
	p.open = len(readers)
	t.procs[pid] = p
	t.rememberKey(s.Key, pid)
	// Before the reaper may see it end: its exit file needs the log.
	if s.Log {
		p.logf = openLog(pid, s.UID, s.GID)
	}
	t.mu.Unlock()

	for _, r := range readers {
		go p.copyOut(r.f, r.kind)
	}
	if s.TimeoutMS > 0 {
		time.AfterFunc(time.Duration(s.TimeoutMS)*time.Millisecond, func() {
			p.mu.Lock()
			ended := p.exit != nil
			if !ended {
				p.timedOut = true
			}
			p.mu.Unlock()
			if !ended {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
	}
	return p, nil
}

// openLog makes LogDir/<pid>.log (its output) and an empty <pid>.exit (so
// a waiter can tell a process Start made from any other PID), owned by the
// process's user.
func openLog(pid int, uid, gid uint32) *os.File {
	_ = os.MkdirAll(agentproto.LogDir, 0o755)
	base := filepath.Join(agentproto.LogDir, strconv.Itoa(pid))
	if f, err := os.OpenFile(base+".exit", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
	f, err := os.OpenFile(base+".log", os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	_ = f.Chown(int(uid), int(gid))
	return f
}

// copyOut moves one output pipe into the ring (and the log file).
func (p *proc) copyOut(f *os.File, kind agentproto.FrameKind) {
	defer f.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for !p.mayWrite(n) {
				changed := p.changed
				p.waiting++
				p.mu.Unlock()
				select {
				case <-changed:
				case <-time.After(time.Second): // holdGrace is measured, not signalled
				}
				p.mu.Lock()
				p.waiting--
			}
			p.ring.write(kind, buf[:n])
			if p.logf != nil && !p.finished {
				_, _ = p.logf.Write(buf[:n])
			}
			p.notify()
			p.mu.Unlock()
		}
		if err != nil {
			break // EOF, or EIO from a terminal whose every replica closed
		}
	}
	p.mu.Lock()
	p.open--
	p.finishIfDone()
	p.notify()
	p.mu.Unlock()
}

// finishIfDone records the end once the process ended and its output is
// complete (done): the exit file is written only then, so a reader of
// <pid>.exit finds <pid>.log whole; Wait answers only then too. p.mu held.
func (p *proc) finishIfDone() {
	if p.finished || !p.done() {
		return
	}
	p.finished = true
	if p.logf != nil {
		// The status, as a shell's wait reports it (procwait's format).
		_ = p.logf.Close()
		_ = os.WriteFile(filepath.Join(agentproto.LogDir, strconv.Itoa(p.pid)+".exit"), []byte(strconv.Itoa(p.exit.Code)+"\n"), 0o644)
	}
}

// reap waits for every child (the agent's own and orphans the kernel
// re-parents to PID 1) as they end, and records the status of its own.
func (a *agent) reap() {
	ch := make(chan os.Signal, 64)
	signalNotifyChild(ch)
	tick := time.NewTicker(time.Second) // a missed SIGCHLD costs at most a second
	defer tick.Stop()
	for {
		select {
		case <-ch:
		case <-tick.C:
		}
		a.procs.reapAll()
	}
}

func (t *table) reapAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		p, ok := t.procs[pid]
		if !ok {
			continue // an orphan: reaped, nothing to record
		}
		p.ended(ws)
		t.exited = append(t.exited, pid)
		for len(t.exited) > keepExited {
			old := t.exited[0]
			t.exited = t.exited[1:]
			if q, ok := t.procs[old]; ok && q.exit != nil {
				delete(t.procs, old)
			}
		}
		t.boundEnded()
	}
}

// keepEndedBytes bounds the output the table keeps for ended processes,
// in all: the newest keep theirs, older ones keep only their exit status
// (a reader then gets a lost frame). The output of running processes is
// bounded by their rings.
const keepEndedBytes = 16 << 20

// boundEnded drops the rings of the oldest ended processes beyond
// keepEndedBytes; t.mu held.
func (t *table) boundEnded() {
	var total int64
	for i := len(t.exited) - 1; i >= 0; i-- {
		q, ok := t.procs[t.exited[i]]
		if !ok {
			continue
		}
		q.mu.Lock()
		if total += int64(q.ring.size); total > keepEndedBytes && q.finished {
			q.ring.clear()
		}
		q.mu.Unlock()
	}
}

// ended records how p ended.
func (p *proc) ended(ws unix.WaitStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := agentproto.Exit{Code: ws.ExitStatus(), TimedOut: p.timedOut}
	if ws.Signaled() {
		e.Code = 128 + int(ws.Signal())
		e.Signal = unix.SignalName(ws.Signal())
	}
	p.exitAt = time.Now()
	e.LifeMicros = p.exitAt.Sub(p.forkAt).Microseconds()
	p.exit = &e
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.finishIfDone()
	p.notify()
	// Output still in flight gets drainGrace; then the exit frame goes.
	time.AfterFunc(drainGrace, func() {
		p.mu.Lock()
		p.finishIfDone()
		p.notify()
		p.mu.Unlock()
	})
}

// done reports whether the exit frame may be sent: the process ended and its
// pipes are at end of file, or drainGrace has passed with nothing read from
// them waiting for room in the ring (descendants that keep the pipes open,
// `cmd &`, do not hold the exit back). p.mu held.
func (p *proc) done() bool {
	return p.exit != nil && (p.open == 0 || time.Since(p.exitAt) >= drainGrace && p.waiting == 0)
}

// writeStdin copies r into the process's stdin; closeAfter closes it at r's
// end (for a terminal: sends ^D, the terminal's end of input).
func (p *proc) writeStdin(r io.Reader, closeAfter bool) error {
	p.mu.Lock()
	w := p.stdin
	if p.tty != nil {
		w = p.tty
	}
	ended := p.exit != nil
	p.mu.Unlock()
	if w == nil || ended {
		return fmt.Errorf("%w: process %d takes no input", errInvalid, p.pid)
	}
	_, err := io.Copy(w, r)
	if closeAfter {
		if p.tty != nil {
			_, _ = p.tty.Write([]byte{4})
		} else {
			p.mu.Lock()
			if p.stdin != nil {
				p.stdin.Close()
				p.stdin = nil
			}
			p.mu.Unlock()
		}
	}
	if errors.Is(err, syscall.EPIPE) {
		return nil // the process stopped reading: like a shell pipe
	}
	return err
}

// lookPath finds argv0 on the PATH of env (the process's, not the agent's).
func lookPath(argv0 string, env []string) (string, error) {
	if argv0 == "" {
		return "", fmt.Errorf("%w: empty program name", errInvalid)
	}
	for i := 0; i < len(argv0); i++ {
		if argv0[i] == '/' {
			return argv0, nil
		}
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			path = kv[5:]
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		c := filepath.Join(dir, argv0)
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: %s: command not found", errNoProgram, argv0)
}

var (
	errInvalid   = errors.New("invalid")
	errNoProgram = errors.New("no such program")
	errNoExec    = errors.New("not executable")
)

// execError classifies a failed fork+exec.
func execError(argv0 string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("%w: %s: %v", errNoProgram, argv0, err)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s: %v", errNoExec, argv0, err)
	}
	return fmt.Errorf("start %s: %w", argv0, err)
}
