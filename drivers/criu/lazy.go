package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/drivers/internal/lazyload"
)

// A lazy restore (RestoreOptions.Lazy) starts the sandbox while `criu
// lazy-pages` still holds its memory: the daemon serves a page on its first
// fault and copies the rest in the background, from the image the restore
// was given, and exits once every page is in (or when the sandbox is gone).
// Until then:
//
//   - the image must stay: RestoreStats.Loaded reports the end (nil when
//     every page is in), and the caller keeps the image until it does;
//   - a cut waits (Checkpoint, bounded by lazyCutWait): a dump while pages
//     are still only in the old image would miss them;
//   - a load that fails (lazy-pages dies with an error, or the sandbox ends
//     before its memory is in) kills the sandbox — a page lazy-pages never
//     served would read as zeros — and Loaded reports why;
//   - Kill and Destroy end lazy-pages, after the sandbox's processes.

// lazyCutWait bounds how long a Checkpoint waits for a lazy restore's
// load to end (a variable: the tests shorten it).
var lazyCutWait = 2 * time.Minute

// testAfterLazyRestore, when set (tests), is called with lazy-pages' pid
// as soon as CRIU's lazy restore returns, before the load can have ended.
var testAfterLazyRestore func(pid int)

// lazyPagesCommand is the command that runs `criu lazy-pages` (a seam:
// the tests hold the load's end back with a wrapper).
var lazyPagesCommand = exec.Command

// lazyLoad is one lazy restore's background load.
type lazyLoad struct {
	cmd    *exec.Cmd
	work   string
	exited chan struct{} // closed when lazy-pages has exited; exitErr then set
	// exitErr is cmd.Wait's error.
	exitErr error

	load *lazyload.Load // the load's outcome (nil: every page is in)
	// forkImages is a fork's private copy of the image, removed once
	// lazy-pages has exited ("": not a fork).
	forkImages string

	stopOnce sync.Once
}

// startLazyPages starts `criu lazy-pages` for a restore from criuDir. It
// shares the restore's work directory, where it listens on
// lazy-pages.socket. A fork's private copy of the image (forked; at
// images) is removed once the load ends.
func (d *Driver) startLazyPages(criuDir, work string, forked bool, images string) (*lazyLoad, error) {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(work, "lazy-pages.socket")
	_ = os.Remove(sock)
	cmd := lazyPagesCommand(d.opts.CriuPath, "lazy-pages", "--images-dir", criuDir, "--work-dir", work, "-o", "lazy-pages.log", "-v4")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	lz := &lazyLoad{cmd: cmd, work: work, exited: make(chan struct{}), load: lazyload.New()}
	if forked {
		lz.forkImages = images
	}
	go func() {
		lz.exitErr = cmd.Wait()
		close(lz.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return lz, nil
		}
		select {
		case <-lz.exited:
			return nil, fmt.Errorf("criu lazy-pages exited: %v (%s)", lz.exitErr, lz.logTail())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			lz.stop()
			return nil, errdefs.Unavailablef("criu lazy-pages: no socket after 10s")
		}
	}
}

func (lz *lazyLoad) logTail() string {
	b, _ := os.ReadFile(filepath.Join(lz.work, "lazy-pages.log"))
	return lastLines(b, 10)
}

// stop kills lazy-pages (if it still runs) and waits for it to exit. A
// nil lz is a no-op.
func (lz *lazyLoad) stop() {
	if lz == nil {
		return
	}
	lz.stopOnce.Do(func() {
		select {
		case <-lz.exited:
			return
		default:
		}
		_ = lz.cmd.Process.Kill()
		<-lz.exited
	})
}

// restored is called as soon as CRIU's lazy restore returns (the tests'
// hook, testAfterLazyRestore). A nil lz is a no-op.
func (lz *lazyLoad) restored() {
	if lz != nil && testAfterLazyRestore != nil {
		testAfterLazyRestore(lz.pid())
	}
}

// pid is lazy-pages' process id (tests).
func (lz *lazyLoad) pid() int { return lz.cmd.Process.Pid }

// watchLazy follows sandbox id's load (ls.lazy) to its end and returns
// RestoreStats.Loaded: one value, then closed (nil for an eager restore).
func (d *Driver) watchLazy(id string, ls *liveSandbox) <-chan error {
	lz := ls.lazy
	if lz == nil {
		return nil
	}
	loaded := make(chan error, 1)
	go func() {
		<-lz.exited
		if lz.forkImages != "" {
			if err := os.RemoveAll(lz.forkImages); err != nil {
				d.log.Warn("remove a fork's copy of the image", "sandbox", id, "err", err)
			}
		}
		var err error
		if st, serr := ls.c.Status(); lz.exitErr != nil {
			err = fmt.Errorf("criu lazy-pages failed before every page was in: %v (%s)", lz.exitErr, lz.logTail())
		} else if serr != nil || st == libcontainer.Stopped {
			err = errors.New("the sandbox ended before every page was in")
		}
		if err != nil {
			err = errdefs.DataLossf("sandbox %s: lazy restore: %v", id, err)
			// What is left runs on memory that will never come: kill it.
			if cm, cerr := manager.New(ls.c.Config().Cgroups); cerr == nil {
				if kerr := killCgroup(context.Background(), cm); kerr != nil {
					d.log.Error("kill a sandbox whose lazy restore failed", "sandbox", id, "err", kerr)
				}
			}
			d.log.Error("lazy restore failed; sandbox killed", "sandbox", id, "err", err)
		}
		lz.load.End(err)
		loaded <- err
		close(loaded)
	}()
	return loaded
}

// waitLazy waits (up to lazyCutWait, or ctx) until sandbox id's lazy
// load, if any, has ended: a cut must not begin before it. A load that
// failed fails the cut.
func waitLazy(ctx context.Context, id string, ls *liveSandbox) error {
	if ls.lazy == nil {
		return nil
	}
	return ls.lazy.load.WaitForCut(ctx, id, lazyCutWait)
}
