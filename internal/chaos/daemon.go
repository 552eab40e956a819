package chaos

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/amber-run/amber/client"
)

// UnmountUnder detaches whatever is still mounted below dir (pinned
// namespaces of sandboxes that could not be destroyed).
func UnmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			syscall.Unmount(f[4], syscall.MNT_DETACH)
		}
	}
}

// Daemon is `amber up` as a child process of the demo.
type Daemon struct {
	Dir, Addr string
	Args      []string
	Env       []string
	cmd       *exec.Cmd
	exited    chan struct{}
}

func (dd *Daemon) Start() error {
	if dd.Addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		dd.Addr = ln.Addr().String()
		ln.Close()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dd.Dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	dd.cmd = exec.Command(self, append([]string{"up", "--data-dir", dd.Dir, "--addr", dd.Addr}, dd.Args...)...)
	dd.cmd.Stdout, dd.cmd.Stderr = logf, logf
	if len(dd.Env) > 0 {
		dd.cmd.Env = append(os.Environ(), dd.Env...)
	}
	dd.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's ^C reaches the demo only
	if err := dd.cmd.Start(); err != nil {
		return err
	}
	dd.exited = make(chan struct{})
	go func() { dd.cmd.Wait(); close(dd.exited) }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if resp, err := http.Get("http://" + dd.Addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-dd.exited:
			return fmt.Errorf("amber up exited: %v (log: %s)", dd.cmd.ProcessState, filepath.Join(dd.Dir, "daemon.log"))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("amber up did not answer within 2 minutes (log: %s)", filepath.Join(dd.Dir, "daemon.log"))
		}
	}
}

// Killed reports whether the daemon's last process ended by SIGKILL (a
// kill-daemon failpoint, or the harness).
func (dd *Daemon) Killed() bool {
	if dd.cmd == nil || dd.cmd.ProcessState == nil {
		return false
	}
	ws, ok := dd.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func (dd *Daemon) Client() (*client.Client, error) {
	key, err := os.ReadFile(filepath.Join(dd.Dir, "admin.key"))
	if err != nil {
		return nil, err
	}
	return client.New("http://"+dd.Addr, strings.TrimSpace(string(key)))
}

func (dd *Daemon) Running() bool {
	if dd.cmd == nil {
		return false
	}
	select {
	case <-dd.exited:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs the daemon this demo started (by its PID) and waits.
func (dd *Daemon) Kill() error {
	if !dd.Running() {
		return errors.New("the daemon is not running")
	}
	dd.cmd.Process.Signal(syscall.SIGKILL)
	<-dd.exited
	return nil
}

func (dd *Daemon) Stop() error {
	if !dd.Running() {
		return nil
	}
	dd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-dd.exited:
		return nil
	case <-time.After(time.Minute):
		dd.cmd.Process.Signal(syscall.SIGKILL)
		<-dd.exited
		return errors.New("the daemon did not stop within a minute of SIGTERM")
	}
}

// Pid is the running daemon's process id.
func (dd *Daemon) Pid() int { return dd.cmd.Process.Pid }
