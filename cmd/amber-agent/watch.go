package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/lib/agentproto"
)

// maxWatches bounds the directories one watch follows.
const maxWatches = 4096

// watch streams changes under ?path= (a directory or a file; recursive=1
// follows every directory below it, also ones made later) as JSON lines,
// until the client goes away. The watch is inotify inside the sandbox, so
// it sees what the sandbox's own processes do.
func (a *agent) watch(w http.ResponseWriter, r *http.Request) {
	root := r.URL.Query().Get("path")
	if !strings.HasPrefix(root, "/") {
		writeErr(w, fmt.Errorf("%w: path %q is not absolute", errInvalid, root))
		return
	}
	root = filepath.Clean(root)
	recursive := r.URL.Query().Get("recursive") == "1"
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		writeErr(w, err)
		return
	}
	f := os.NewFile(uintptr(fd), "inotify") // closing it ends the reader below
	wt := &watcher{fd: fd, dirs: map[int32]string{}, recursive: recursive}
	if err := wt.add(root); err != nil {
		f.Close()
		if errors.Is(err, unix.ENOENT) {
			writeErr(w, fmt.Errorf("%w: %s", errNotFound, root))
			return
		}
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	go func() {
		<-r.Context().Done()
		f.Close()
	}()
	enc := json.NewEncoder(w)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(ev.Len)
			name := ""
			if nameLen > 0 && off+unix.SizeofInotifyEvent+nameLen <= n {
				name = strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen]), "\x00")
			}
			off += unix.SizeofInotifyEvent + nameLen
			for _, e := range wt.events(ev.Wd, ev.Mask, name) {
				if enc.Encode(e) != nil {
					f.Close()
					return
				}
			}
		}
		if fl != nil {
			fl.Flush()
		}
	}
}

type watcher struct {
	fd        int
	recursive bool
	mu        sync.Mutex
	dirs      map[int32]string
}

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_DELETE_SELF |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_MOVE_SELF

// add watches path (and, recursive, every directory below it).
func (wt *watcher) add(path string) error {
	wd, err := unix.InotifyAddWatch(wt.fd, path, watchMask)
	if err != nil {
		return err
	}
	wt.mu.Lock()
	wt.dirs[int32(wd)] = path
	n := len(wt.dirs)
	wt.mu.Unlock()
	if !wt.recursive || n >= maxWatches {
		return nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil // a file, or gone meanwhile
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = wt.add(filepath.Join(path, e.Name()))
		}
	}
	return nil
}

// events turns one inotify event into what the client sees.
func (wt *watcher) events(wd int32, mask uint32, name string) []agentproto.WatchEvent {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return []agentproto.WatchEvent{{Op: "overflow"}}
	}
	wt.mu.Lock()
	dir, ok := wt.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(wt.dirs, wd)
	}
	wt.mu.Unlock()
	if !ok || mask&unix.IN_IGNORED != 0 {
		return nil
	}
	p := dir
	if name != "" {
		p = filepath.Join(dir, name)
	}
	var op string
	switch {
	case mask&unix.IN_CREATE != 0, mask&unix.IN_MOVED_TO != 0:
		op = "create"
		if mask&unix.IN_MOVED_TO != 0 {
			op = "rename"
		}
		if wt.recursive && mask&unix.IN_ISDIR != 0 {
			_ = wt.add(p)
		}
	case mask&unix.IN_MODIFY != 0, mask&unix.IN_CLOSE_WRITE != 0:
		op = "write"
	case mask&unix.IN_DELETE != 0, mask&unix.IN_DELETE_SELF != 0:
		op = "remove"
	case mask&unix.IN_MOVED_FROM != 0, mask&unix.IN_MOVE_SELF != 0:
		op = "rename"
	case mask&unix.IN_ATTRIB != 0:
		op = "chmod"
	default:
		return nil
	}
	return []agentproto.WatchEvent{{Path: p, Op: op}}
}
