package takeover

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/stores/sqlite"
)

func TestParseFlockHolder(t *testing.T) {
	locks := "1: POSIX  ADVISORY  WRITE 77 fe:00:12 0 EOF\n" +
		"2: FLOCK  ADVISORY  WRITE 3810 fe:00:9978609 0 EOF\n" +
		"2: -> FLOCK  ADVISORY  WRITE 3999 fe:00:9978609 0 EOF\n"
	if pid, err := parseFlockHolder(locks, "fe:00:9978609"); err != nil || pid != 3810 {
		t.Errorf("holder: %d %v, want 3810", pid, err)
	}
	if _, err := parseFlockHolder(locks, "fe:00:12"); err == nil {
		t.Error("a POSIX lock taken for an flock")
	}
	if _, err := parseFlockHolder("2: FLOCK  ADVISORY  WRITE x fe:00:1 0 EOF", "fe:00:1"); err == nil {
		t.Error("a bad pid accepted")
	}
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("AMBER_TEST_HOLD_DB"); dir != "" {
		holdDBStopped(dir) // a daemon stopped inside a write
	}
	os.Exit(m.Run())
}

// holdDBStopped is the child of TestTakeOverEndsStoppedHolder: it takes the
// data dir's flock (as amber up does), opens events.db, begins a write
// transaction and stops itself inside it, as a daemon SIGSTOPped mid-write.
func holdDBStopped(dir string) {
	f, err := os.OpenFile(filepath.Join(dir, "daemon.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	var db *sql.DB
	if err == nil {
		db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "events.db")+"?_txlock=immediate")
	}
	var tx *sql.Tx
	if err == nil {
		tx, err = db.Begin()
	}
	if err == nil {
		_, err = tx.Exec(`INSERT INTO schema_version (version) VALUES (99)`)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("holding")
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	time.Sleep(time.Hour)
	os.Exit(0)
}

// TestTakeOverEndsStoppedHolder: a process that holds the data dir's flock
// and is stopped inside an SQLite write transaction keeps events.db locked;
// Open waits out the lease, ends exactly that process and opens the
// database; a database that is not locked opens at once.
func TestTakeOverEndsStoppedHolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "events.db")
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "AMBER_TEST_HOLD_DB="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { io.ReadAll(out); exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() }) // ours: ended here if the test fails early
	// Wait for the child to stop inside its transaction.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "T" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder never stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid, err := flockHolder(filepath.Join(dir, "daemon.lock")); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("flock holder %d (%v), want the child %d", pid, err, cmd.Process.Pid)
	}

	start := time.Now()
	s, err = Open(ctx, "events.db", filepath.Join(dir, "daemon.lock"), time.Second, lg, func() (*sqlite.Store, error) {
		return sqlite.Open(path, sqlite.Options{})
	})
	if err != nil {
		t.Fatalf("take over: %v", err)
	}
	s.Close()
	select {
	case err := <-exited:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the holder ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder is still there")
	}
	t.Logf("opened after %s (the holder ended)", time.Since(start).Round(time.Millisecond))

	// Nobody holds it now: the open succeeds at once, nothing is ended.
	start = time.Now()
	s, err = Open(ctx, "events.db", filepath.Join(dir, "daemon.lock"), time.Second, lg, func() (*sqlite.Store, error) {
		return sqlite.Open(path, sqlite.Options{})
	})
	if err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("unlocked open: %v after %s", err, time.Since(start))
	}
	s.Close()
}
