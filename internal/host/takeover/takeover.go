// Package takeover takes a data dir over from a stopped daemon (amber up
// --take-over).
//
// The data-dir lease fences a stopped daemon once it resumes, but only if
// the new daemon can write: a daemon stopped inside an SQLite write
// transaction (SIGSTOP reaches every thread at once, whatever it was
// doing) keeps meta.db or events.db locked for as long as it stays
// stopped, and nothing else can write them. So a database that stays
// locked longer than the lease TTL (plus SQLite's own busy wait) is held by
// a process that cannot hold a valid lease any more: Open then ends
// that process — the one holding the data dir's flock, found in
// /proc/locks, so a recycled PID is never hit — with SIGKILL, waits for it
// to be gone, and opens again. A daemon that is merely slow finishes its
// transaction within that time and is fenced by the lease as usual.
package takeover

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Open calls open until it succeeds or fails for another reason
// than a locked database; a lock that outlasts ttl ends the holder of
// lockPath's flock (see above).
func Open[T any](ctx context.Context, what, lockPath string, ttl time.Duration, lg *slog.Logger, open func() (T, error)) (T, error) {
	deadline := time.Now().Add(ttl)
	for {
		v, err := open()
		if err == nil || !lockedDB(err) {
			return v, err
		}
		if time.Now().Before(deadline) {
			lg.Warn("database locked by the daemon being taken over; waiting", "db", what, "err", err)
			select {
			case <-ctx.Done():
				return v, ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		pid, perr := flockHolder(lockPath)
		if perr != nil {
			return v, fmt.Errorf("%s stays locked (%w) and its holder is unknown: %v", what, err, perr)
		}
		lg.Warn("the daemon being taken over holds a database lock past its lease (stopped in a write); ending it", "db", what, "pid", pid)
		if err := endProcess(ctx, pid); err != nil {
			return v, fmt.Errorf("%s stays locked by pid %d: %w", what, pid, err)
		}
		deadline = time.Now().Add(ttl)
	}
}

// lockedDB tells an SQLite "database is locked" (SQLITE_BUSY) error.
func lockedDB(err error) bool {
	s := err.Error()
	return strings.Contains(s, "SQLITE_BUSY") || strings.Contains(s, "database is locked")
}

// flockHolder returns the PID holding an flock on path, from /proc/locks.
func flockHolder(path string) (int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0, err
	}
	return parseFlockHolder(string(b), id)
}

// parseFlockHolder finds the PID of the FLOCK on file id ("maj:min:inode",
// as /proc/locks prints it) in a /proc/locks listing.
func parseFlockHolder(locks, id string) (int, error) {
	for _, line := range strings.Split(locks, "\n") {
		f := strings.Fields(line)
		// "1: FLOCK  ADVISORY  WRITE 3810 fe:00:9978609 0 EOF"; a waiter
		// line starts "1: -> FLOCK …".
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != id {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || pid <= 0 {
			return 0, fmt.Errorf("/proc/locks: bad pid in %q", line)
		}
		return pid, nil
	}
	return 0, fmt.Errorf("no flock on %s in /proc/locks", id)
}

// endProcess SIGKILLs pid (a stopped process dies too) and waits until it
// is gone (or a zombie: its locks are released by then).
func endProcess(ctx context.Context, pid int) error {
	if pid == os.Getpid() {
		return fmt.Errorf("refusing to end this process")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	for i := 0; ; i++ {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // gone
		}
		if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return nil
		}
		if i > 200 {
			return fmt.Errorf("pid %d still alive 10 s after SIGKILL", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
