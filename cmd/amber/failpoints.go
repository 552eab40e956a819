package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/failpoint"
)

// testFailpoints arms failpoints from AMBER_TEST_FAILPOINTS
// ("point=N:action[/ARG],…", see failpoint.ParseActions) so that tests and
// `amber chaos` can crash, fail or slow down a daemon they run as a process
// exactly at a point of the code. Points: the gateway's (gateway.*), the
// session harness's (session.*), the chunk store's steps of a Put
// (chunkstore.chunks, .manifest, .publish, .committed) and the store
// wrappers' (internal/host/faults: blob.write, blob.read, eventlog.append,
// eventlog.read, eventlog.lease), the metadata store's (meta.write,
// meta.read), the engine's (driver.checkpoint, driver.restore, the local
// commit's checkpoint.local-kept and checkpoint.upload) and a drain's
// moves (cluster.move-out, cluster.move-in.row).
// Actions, at the N-th evaluation:
//
//	kill-daemon      SIGKILL this process
//	kill-sandbox     SIGKILL the sandbox the point was reached for, and go on
//	stop-self        SIGSTOP this process, after stopSelfQuiesce (the fencing
//	                 test SIGCONTs it later)
//	error/DUR        every evaluation for DUR fails with errdefs.ErrUnavailable
//	                 (a store that is down for a while)
//	enospc/DUR       every evaluation for DUR fails with ENOSPC (disk full)
//	slow/DUR[@PER]   every evaluation for DUR sleeps PER (default 100ms)
//	                 and goes on (a slow disk)
//	hang/DUR         every evaluation for DUR blocks until its call's
//	                 context ends (and fails with its error) or DUR is over
//	                 (and goes on): a store that stopped answering
//
// Each firing (each evaluation an action acts on) is first appended to
// AMBER_TEST_FAILPOINT_LOG, synced: "point subject action" — the test's proof
// that the point was reached. With AMBER_TEST_FAILPOINT_LOG set and no
// spec, the points are counted but nothing fires; at a clean shutdown the
// counts are appended as "#hits point N" lines (writeFailpointCounts): the
// chaos harness's calibration. Both unset (production): nil, which costs a
// nil check at each point.
func testFailpoints(drv sandbox.Driver, lg *slog.Logger) (*failpoint.Set, error) {
	spec := os.Getenv("AMBER_TEST_FAILPOINTS")
	logPath := os.Getenv("AMBER_TEST_FAILPOINT_LOG")
	if spec == "" {
		if logPath == "" {
			return nil, nil
		}
		return failpoint.New(), nil
	}
	var mu sync.Mutex
	note := func(point, subject, action string) {
		lg.Warn("test failpoint fired", "point", point, "subject", subject, "action", action)
		if logPath == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		if subject = strings.ReplaceAll(subject, " ", "_"); subject == "" {
			subject = "-"
		}
		fmt.Fprintf(f, "%s %s %s\n", point, subject, action)
		f.Sync()
		f.Close()
	}
	return failpoint.ParseActions(spec, func(point, action, arg string) (failpoint.Action, error) {
		once := func(fn func(subject string) error) (failpoint.Action, error) {
			if arg != "" {
				return failpoint.Action{}, fmt.Errorf("action %s takes no argument", action)
			}
			return failpoint.Action{Fn: fn}, nil
		}
		window := func(hit func(subject string) error) (failpoint.Action, error) {
			d, err := time.ParseDuration(arg)
			if err != nil || d <= 0 {
				return failpoint.Action{}, fmt.Errorf("action %s/DUR wants a positive duration, not %q", action, arg)
			}
			return failpoint.Action{Fn: failpoint.Window(d, hit), Each: true}, nil
		}
		switch action {
		case "kill-daemon":
			return once(func(subject string) error {
				note(point, subject, action)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never returns
			})
		case "kill-sandbox":
			return once(func(subject string) error {
				note(point, subject, action)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := drv.Kill(ctx, subject); err != nil {
					lg.Error("test failpoint: kill sandbox", "sandbox", subject, "err", err)
				}
				return nil
			})
		case "stop-self":
			return once(func(subject string) error {
				note(point, subject, action)
				// Let the other goroutines' writes in flight finish first: a
				// process stopped inside an SQLite write transaction holds the
				// file's write lock, and no other daemon could open the log
				// until it resumes (see docs/ARCHITECTURE.md, fencing).
				time.Sleep(stopSelfQuiesce)
				stopUntilContinued()
				return nil // SIGCONTed: go on as if nothing happened
			})
		case "error":
			return window(func(subject string) error {
				note(point, subject, action)
				return errdefs.Unavailablef("failpoint %s: injected store error", point)
			})
		case "enospc":
			return window(func(subject string) error {
				note(point, subject, action)
				return fmt.Errorf("failpoint %s: write %s: %w", point, subject, syscall.ENOSPC)
			})
		case "slow":
			per := 100 * time.Millisecond
			if a, p, ok := strings.Cut(arg, "@"); ok {
				d, err := time.ParseDuration(p)
				if err != nil || d <= 0 {
					return failpoint.Action{}, fmt.Errorf("action slow/DUR@PER wants a positive PER, not %q", p)
				}
				arg, per = a, d
			}
			return window(func(subject string) error {
				note(point, subject, action)
				time.Sleep(per)
				return nil
			})
		case "hang":
			return hangWindow(arg, func(subject string) { note(point, subject, action) })
		}
		return failpoint.Action{}, fmt.Errorf("unknown action %q (have kill-daemon, kill-sandbox, stop-self, error/DUR, enospc/DUR, slow/DUR[@PER], hang/DUR)", action)
	})
}

// hangWindow is the hang/DUR action: from its first evaluation on, for DUR
// (arg), each evaluation blocks until its call's context ends, and fails
// with ctx's error, or until DUR is over, and goes on. note records each.
func hangWindow(arg string, note func(subject string)) (failpoint.Action, error) {
	d, err := time.ParseDuration(arg)
	if err != nil || d <= 0 {
		return failpoint.Action{}, fmt.Errorf("action hang/DUR wants a positive duration, not %q", arg)
	}
	var mu sync.Mutex
	var until time.Time
	return failpoint.Action{Each: true, CtxFn: func(ctx context.Context, subject string) error {
		mu.Lock()
		if until.IsZero() {
			until = time.Now().Add(d)
		}
		left := time.Until(until)
		mu.Unlock()
		if left <= 0 {
			return nil
		}
		note(subject)
		t := time.NewTimer(left)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}}, nil
}

// stopSelfQuiesce is how long stop-self lets in-flight writes finish.
const stopSelfQuiesce = 500 * time.Millisecond

// stopUntilContinued SIGSTOPs this process and returns only once it was
// continued. kill(2) of one's own process with SIGSTOP is not synchronous
// for the caller: the group stop reaches the calling thread some time after
// kill returns, and the goroutine that evaluated the point could meanwhile
// go on past it (a fencing check passed, a request sent) — exactly what the
// point is there to prevent. So the caller waits for the SIGCONT itself.
func stopUntilContinued() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	select {
	case <-cont:
	case <-time.After(time.Hour): // nobody continued it: a test gave up on this process
	}
}

// writeFailpointCounts appends every point's evaluation count to
// AMBER_TEST_FAILPOINT_LOG as "#hits point N" (after a clean shutdown).
func writeFailpointCounts(fps *failpoint.Set) {
	p := os.Getenv("AMBER_TEST_FAILPOINT_LOG")
	if fps == nil || p == "" {
		return
	}
	counts := fps.Counts()
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	for _, n := range names {
		fmt.Fprintf(f, "#hits %s %d\n", n, counts[n])
	}
	f.Sync()
}
