// Package writebehind starts the writeback of a checkpoint image's files to
// the disk while they are still being written, so that the fsync that makes
// the image durable afterwards has little left to wait for.
//
// A strict tool call is acknowledged once its cut is durable on the node:
// the driver's save (the sandbox frozen), then an fsync of the whole image.
// Measured on this machine's disk, 70 MB written at the pace of a 64 MiB
// save (about 130 ms) then fsync'd took 37–43 ms for the fsync; with
// writeback started every 10 ms during the writes, 1–4 ms, the writes
// themselves no slower. The fsync stays: write-behind only moves the disk
// work earlier, into time the save spends anyway; durability is still
// whatever the final fsync reports.
package writebehind

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Interval is how often writeback is started by default.
const Interval = 10 * time.Millisecond

// W starts writeback of its files every interval until Stop.
type W struct {
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	started atomic.Int64 // sync_file_range calls made
}

// Files starts write-behind of files (which the caller keeps open and
// closes after Stop).
func Files(files []*os.File, every time.Duration) *W {
	fds := make([]int, 0, len(files))
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	return start(every, func() []int { return fds }, func() {})
}

// Dir starts write-behind of the regular files that appear under dir (a
// process writing an image by path, as CRIU does): each is opened once for
// reading, and closed at Stop.
func Dir(dir string, every time.Duration) *W {
	open := map[string]int{}
	var fds []int
	list := func() []int {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if _, ok := open[p]; ok {
				return nil
			}
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err == nil {
				open[p] = fd
				fds = append(fds, fd)
			}
			return nil
		})
		return fds
	}
	return start(every, list, func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	})
}

func start(every time.Duration, fds func() []int, end func()) *W {
	if every <= 0 {
		every = Interval
	}
	w := &W{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer end()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			for _, fd := range fds() {
				// Errors are not the caller's concern here: the fsync
				// that follows reports what matters.
				_ = unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
				w.started.Add(1)
			}
		}
	}()
	return w
}

// Stop ends the write-behind and waits for its last call. It may be called
// more than once.
func (w *W) Stop() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// Started is the number of writebacks started (for tests).
func (w *W) Started() int64 { return w.started.Load() }
