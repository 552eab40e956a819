package gvisor

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestZombieSandboxIsStopped: runsc reports a sandbox "running" while its
// process is an unreaped zombie (kill(pid, 0) succeeds on one); the driver
// reads it as stopped and reaps it when it is its child. A live process
// stays running.
func TestZombieSandboxIsStopped(t *testing.T) {
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()
	if st := deadIfZombie(containerState{Status: "running", Pid: live.Process.Pid}); st.Status != "running" {
		t.Fatalf("a live process read as %q", st.Status)
	}

	dead := exec.Command("true")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	// Not waited for: once it exits it is a zombie of this process.
	for deadline := time.Now().Add(10 * time.Second); !zombieOrGone(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not become a zombie", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		t.Fatalf("the zombie %d is not there: %v", pid, err)
	}
	if st := deadIfZombie(containerState{Status: "running", Pid: pid}); st.Status != "stopped" {
		t.Fatalf("a zombie read as %q, want stopped", st.Status)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !os.IsNotExist(err) {
		t.Fatalf("the zombie %d was not reaped: %v", pid, err)
	}
	if st := deadIfZombie(containerState{Status: "running", Pid: pid}); st.Status != "stopped" {
		t.Fatalf("a gone process read as %q, want stopped", st.Status)
	}
}
