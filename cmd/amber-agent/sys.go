package main

import (
	"bytes"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/lib/agentproto"
)

func signalNotifyChild(ch chan os.Signal) { signal.Notify(ch, syscall.SIGCHLD) }

// openPTY opens a new pseudo-terminal of rows×cols (24×80 by default) and
// returns its master and replica.
func openPTY(rows, cols uint16) (master, replica *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*os.File, *os.File, error) { m.Close(); return nil, nil, err }
	var unlock int32
	if err := ioctl(m.Fd(), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		return fail(fmt.Errorf("unlockpt: %w", err))
	}
	var n uint32
	if err := ioctl(m.Fd(), unix.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		return fail(fmt.Errorf("ptsname: %w", err))
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	if err := setSize(m, rows, cols); err != nil {
		s.Close()
		return fail(err)
	}
	return m, s, nil
}

func setSize(f *os.File, rows, cols uint16) error {
	return unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

func ioctl(fd, req, arg uintptr) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg); e != 0 {
		return e
	}
	return nil
}

// listProcesses reads /proc: every process of the sandbox but the agent.
func listProcesses() ([]agentproto.Process, error) {
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []agentproto.Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p, ok := readProc(pid)
		if ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// census counts the sandbox's processes (the agent too) and its
// established TCP sockets, as /proc shows them.
func census() (agentproto.Census, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return agentproto.Census{}, err
	}
	var c agentproto.Census
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			c.Processes++
		}
	}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if b, err := os.ReadFile(f); err == nil {
			c.TCPEstablished += agentproto.CountEstablished(string(b))
		}
	}
	return c, nil
}

func readProc(pid int) (agentproto.Process, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return agentproto.Process{}, false
	}
	// comm is in parentheses and may hold anything: split after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return agentproto.Process{}, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return agentproto.Process{}, false
	}
	p := agentproto.Process{PID: pid, State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1])
	p.StartTicks, _ = strconv.ParseUint(f[19], 10, 64)
	if cl, err := os.ReadFile(dir + "/cmdline"); err == nil && len(cl) > 0 {
		p.Args = strings.Split(strings.TrimSuffix(string(cl), "\x00"), "\x00")
	} else {
		p.Args = []string{"[" + string(stat[bytes.IndexByte(stat, '(')+1:i]) + "]"}
	}
	return p, true
}
