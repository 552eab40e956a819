package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/lib/agentproto"
	"github.com/amber-run/amber/lib/statmode"
)

// The file calls (see lib/agentproto). The agent is in the sandbox's mount
// namespace and is the sandbox's root, so a path is resolved as any
// process of the sandbox would resolve it — the sandbox's kernel follows
// its symlinks inside the sandbox, and tmpfs mounts, /dev/shm and whatever
// else the sandbox mounted are seen, which the host's view of the layer is
// not. Confinement to the sandbox is the sandbox's own: the agent can reach
// nothing the sandbox's root cannot. What is checked here is what the FS
// contract (core/sandbox.FS) promises on top: absolute, lexically clean
// paths; nothing but a regular file opened for reading or writing (a FIFO
// or a device is refused before it is opened); writes that are atomic;
// removals that never follow a symlink. Errors name the sandbox path and
// the errno and carry a code the host maps to its error kinds.

func (a *agent) fileRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/files", a.readFile)
	mux.HandleFunc("PUT /v1/files", a.writeFile)
	mux.HandleFunc("GET /v1/files/stat", a.statFile)
	mux.HandleFunc("GET /v1/files/list", a.listFiles)
	mux.HandleFunc("POST /v1/files/mkdir", a.mkdir)
	mux.HandleFunc("POST /v1/files/rename", a.rename)
	mux.HandleFunc("POST /v1/files/remove", a.remove)
}

// fileError is a failed file call: its code (agentproto.Error.Code) and
// HTTP status, and a message that names the sandbox path.
type fileError struct {
	code   string
	status int
	msg    string
}

func (e *fileError) Error() string { return e.msg }

// fileErr classifies err of op on the sandbox path p as the host's
// confinedfs does (the same errno, the same kind).
func fileErr(op, p string, err error) error {
	var fe *fileError
	if errors.As(err, &fe) {
		return err
	}
	text := err.Error()
	var errno unix.Errno
	if errors.As(err, &errno) {
		text = errno.Error()
	}
	code, status := "internal", http.StatusInternalServerError
	switch errno {
	case unix.ENOENT:
		code, status = "not_found", http.StatusNotFound
	case unix.EEXIST:
		code, status = "exists", http.StatusConflict
	case unix.ENOTEMPTY, unix.EBUSY, unix.EXDEV:
		code, status = "precondition", http.StatusPreconditionFailed
	case unix.EACCES, unix.EPERM, unix.EROFS:
		code, status = "denied", http.StatusForbidden
	case unix.ELOOP, unix.ENOTDIR, unix.EISDIR, unix.ENAMETOOLONG, unix.EINVAL:
		code, status = "invalid", http.StatusBadRequest
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG, unix.EMFILE, unix.ENFILE:
		code, status = "exhausted", http.StatusInsufficientStorage
	}
	return &fileError{code: code, status: status, msg: fmt.Sprintf("%s %q: %s", op, p, text)}
}

// failf is a fileError with a code of its own.
func failf(op, p, code string, status int, format string, args ...any) error {
	return &fileError{code: code, status: status, msg: fmt.Sprintf("%s %q: %s", op, p, fmt.Sprintf(format, args...))}
}

func invalidf(op, p, format string, args ...any) error {
	return failf(op, p, "invalid", http.StatusBadRequest, format, args...)
}

func writeFileErr(w http.ResponseWriter, err error) {
	var fe *fileError
	if !errors.As(err, &fe) {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(fe.status)
	_ = json.NewEncoder(w).Encode(agentproto.Error{Code: fe.code, Message: fe.msg})
}

// cleanPath is agentproto.CleanPath with the call's error.
func cleanPath(op, p string) (string, error) {
	c, err := agentproto.CleanPath(p)
	if err != nil {
		return "", invalidf(op, p, "%s", strings.TrimPrefix(err.Error(), agentproto.ErrPath.Error()+": "))
	}
	return c, nil
}

// abort ends a streamed answer whose head was sent: the host sees a reset
// stream, never a clean end, so a cut answer is never taken for a whole one.
func abort() { panic(http.ErrAbortHandler) }

// readFile streams the regular file at ?path= (symlinks followed). A file
// larger than ?max= is refused before a byte is sent; one that grows past
// it while it is read ends the stream with a reset.
func (a *agent) readFile(w http.ResponseWriter, r *http.Request) {
	const op = "read"
	p, err := cleanPath(op, r.URL.Query().Get("path"))
	if err != nil {
		writeFileErr(w, err)
		return
	}
	limit, err := strconv.ParseInt(r.URL.Query().Get("max"), 10, 64)
	if err != nil || limit <= 0 {
		writeFileErr(w, invalidf(op, p, "bad max"))
		return
	}
	f, size, err := openRegular(p)
	if err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	defer f.Close()
	if size > limit {
		writeFileErr(w, failf(op, p, "too_large", http.StatusRequestEntityTooLarge, "%d bytes, more than the limit of %d", size, limit))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	n, err := io.CopyBuffer(w, io.LimitReader(f, limit+1), make([]byte, 256<<10))
	if err != nil || n > limit {
		abort()
	}
}

// errNotRegular: anything but a regular file is refused for reading.
var errNotRegular = errors.New("not a regular file")

// openRegular opens the regular file at p for reading: with O_PATH first
// (which opens nothing), checked with fstat, then opened through
// /proc/self/fd — the very inode — so neither a FIFO (a read that blocks
// forever) nor a device node is ever opened.
func openRegular(p string) (*os.File, int64, error) {
	opath, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(opath)
	var st unix.Stat_t
	if err := unix.Fstat(opath, &st); err != nil {
		return nil, 0, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return nil, 0, unix.EISDIR
	default:
		return nil, 0, &fileError{code: "invalid", status: http.StatusBadRequest, msg: "read " + strconv.Quote(p) + ": " + errNotRegular.Error()}
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(opath), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, err
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Dev != st.Dev || st2.Ino != st.Ino {
		unix.Close(fd)
		return nil, 0, errors.New("the file changed while it was opened")
	}
	// The sandbox's /proc is the agent's to read, not the files API's:
	// the agent's own initial environment (/proc/1/environ) holds its
	// token. The host's view never had /proc's contents either.
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Type == unix.PROC_SUPER_MAGIC {
		unix.Close(fd)
		return nil, 0, &fileError{code: "denied", status: http.StatusForbidden, msg: "read " + strconv.Quote(p) + ": a file of /proc"}
	}
	return os.NewFile(uintptr(fd), p), st2.Size, nil
}

// writeFile replaces the file at ?path= with the body, atomically: the
// body goes to a new temporary file in the same directory (O_EXCL, so
// nothing existing is written through), which gets ?mode= (an os.FileMode's
// permission and sticky bits, 0: 0644; set-ID bits are dropped), is
// fsynced and renamed over the path; then the directory is fsynced. A body
// that ends early (the host went away, the connection broke) leaves the
// old file as it was and no temporary file behind. A symlink at the path
// is replaced, not followed; missing parents are made (0755); a directory
// at the path is refused.
func (a *agent) writeFile(w http.ResponseWriter, r *http.Request) {
	const op = "write"
	p, err := cleanPath(op, r.URL.Query().Get("path"))
	if err == nil && p == "/" {
		err = invalidf(op, p, "is the root directory")
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	mode, err := strconv.ParseUint(r.URL.Query().Get("mode"), 10, 32)
	if err != nil {
		writeFileErr(w, invalidf(op, p, "bad mode"))
		return
	}
	dir, base := path.Split(p)
	if err := mkdirAll(dir, 0o755); err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	if err := writeAtomic(dir, base, r.Body, permOf(uint32(mode), 0o644)); err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeAtomic is writeFile's temporary file, fsync and rename in dir.
func writeAtomic(dir, name string, body io.Reader, perm uint32) error {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var tmp string
	fd := -1
	for range 8 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		tmp = ".amber-" + hex.EncodeToString(b[:]) + ".tmp"
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		f.Close()
		if !done {
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err := io.CopyBuffer(f, readerOnly{body}, make([]byte, 256<<10)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return err
	}
	if err := unix.Fsync(fd); err != nil {
		return err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return err
	}
	done = true
	return unix.Fsync(dfd)
}

// readerOnly hides a reader's WriteTo, so that CopyBuffer uses its buffer.
type readerOnly struct{ io.Reader }

// permOf turns an os.FileMode's permission and sticky bits into st_mode
// bits (set-ID bits dropped: a tenant must not plant a set-ID binary owned
// by the sandbox's root); 0 is dflt.
func permOf(mode uint32, dflt uint32) uint32 {
	p := mode & 0o777
	if os.FileMode(mode)&os.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	if p == 0 {
		return dflt
	}
	return p
}

// mkdirAll makes sure the directory p exists (a symlink to one counts),
// making missing parents; each directory it makes gets perm (set on the
// directory itself, whatever the agent's umask). A component that exists
// and is not a directory is ENOTDIR.
func mkdirAll(p string, perm uint32) error {
	var st unix.Stat_t
	err := unix.Stat(p, &st)
	if err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return unix.ENOTDIR
		}
		return nil
	}
	if err != unix.ENOENT {
		return err
	}
	if parent := path.Dir(path.Clean(p)); parent != p {
		if err := mkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := unix.Mkdir(p, 0o700); err != nil {
		if err != unix.EEXIST {
			return err
		}
		// Raced with someone (theirs, if a directory), or p is a
		// dangling symlink (ENOENT, as confinedfs says; never a loop).
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return unix.ENOTDIR
		}
		return nil
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, perm)
}

// fileInfo is lstat's view of name in the directory dfd.
func fileInfo(dfd int, name, label string) (agentproto.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return agentproto.FileInfo{}, err
	}
	fi := agentproto.FileInfo{Name: label, Size: st.Size, Mode: uint32(statmode.FileMode(st.Mode)), MTime: st.Mtim.Nano()}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, agentproto.MaxPath+1)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return agentproto.FileInfo{}, err
		}
		fi.Link = string(buf[:min(n, agentproto.MaxPath)])
	}
	return fi, nil
}

// statFile describes ?path= without following a symlink there (lstat);
// symlinks in its parents are followed.
func (a *agent) statFile(w http.ResponseWriter, r *http.Request) {
	const op = "stat"
	p, err := cleanPath(op, r.URL.Query().Get("path"))
	if err != nil {
		writeFileErr(w, err)
		return
	}
	dir, base, label := path.Dir(p), path.Base(p), path.Base(p)
	if p == "/" {
		dir, base = "/", "."
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	defer unix.Close(dfd)
	fi, err := fileInfo(dfd, base, label)
	if err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	writeJSON(w, fi)
}

// listFiles streams the entries of the directory ?path= (a symlink there
// is followed), sorted by name, each as statFile would describe it, one
// JSON per line. An error after the first line resets the stream.
func (a *agent) listFiles(w http.ResponseWriter, r *http.Request) {
	const op = "list"
	p, err := cleanPath(op, r.URL.Query().Get("path"))
	if err != nil {
		writeFileErr(w, err)
		return
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	var names []string
	for {
		batch, err := d.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > agentproto.MaxListEntries {
			writeFileErr(w, failf(op, p, "exhausted", http.StatusInsufficientStorage, "more than %d entries", agentproto.MaxListEntries))
			return
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			writeFileErr(w, fileErr(op, p, err))
			return
		}
	}
	slices.Sort(names)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, n := range names {
		fi, err := fileInfo(fd, n, n)
		if err == unix.ENOENT {
			continue // removed since readdir
		}
		if err != nil || enc.Encode(fi) != nil {
			abort()
		}
	}
}

func (a *agent) mkdir(w http.ResponseWriter, r *http.Request) {
	const op = "mkdir"
	var m agentproto.Mkdir
	if err := decode(r, &m); err != nil {
		writeErr(w, err)
		return
	}
	p, err := cleanPath(op, m.Path)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	if err := mkdirAll(p, permOf(m.Mode, 0o755)); err != nil {
		if err == unix.ENOTDIR {
			err = failf(op, p, "exists", http.StatusConflict, "a path component exists and is not a directory")
		}
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// rename is rename(2) of two sandbox paths: an existing file at To is
// replaced, a directory may replace an empty directory only; neither may
// be the root. The last components are not followed (a symlink is
// renamed, not its target).
func (a *agent) rename(w http.ResponseWriter, r *http.Request) {
	const op = "rename"
	var m agentproto.Rename
	if err := decode(r, &m); err != nil {
		writeErr(w, err)
		return
	}
	from, err := cleanPath(op, m.From)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	to, err := cleanPath(op, m.To)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	if from == "/" || to == "/" {
		writeFileErr(w, invalidf(op, from, "cannot rename the root directory"))
		return
	}
	if err := unix.Rename(from, to); err != nil {
		if err == unix.EXDEV {
			err = failf(op, from, "precondition", http.StatusPreconditionFailed, "%q is on another filesystem (or a directory of the template's layer)", to)
		}
		writeFileErr(w, fileErr(op, from, err))
		return
	}
	// Durable once answered, as a write is.
	for _, d := range []string{path.Dir(to), path.Dir(from)} {
		if err := syncDir(d); err != nil {
			writeFileErr(w, fileErr(op, to, err))
			return
		}
		if path.Dir(to) == path.Dir(from) {
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// remove removes a path: a symlink is removed, never followed; a directory
// must be empty unless recursive (os.RemoveAll: it walks with directory
// descriptors opened O_NOFOLLOW). A missing path is not_found; "/" is
// refused.
func (a *agent) remove(w http.ResponseWriter, r *http.Request) {
	const op = "remove"
	var m agentproto.Remove
	if err := decode(r, &m); err != nil {
		writeErr(w, err)
		return
	}
	p, err := cleanPath(op, m.Path)
	if err == nil && p == "/" {
		err = invalidf(op, p, "cannot remove the root directory")
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	err = unix.Unlink(p)
	if err == unix.EISDIR || err == unix.EPERM {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if !m.Recursive {
				err = unix.Rmdir(p)
				if err == unix.ENOTEMPTY || err == unix.EEXIST {
					err = failf(op, p, "precondition", http.StatusPreconditionFailed, "directory not empty")
				}
			} else {
				err = os.RemoveAll(p)
			}
		}
	}
	if err != nil {
		writeFileErr(w, fileErr(op, p, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
