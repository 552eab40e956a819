package agentproto

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// FileInfo describes one file (GET /v1/files/stat, one line of
// /v1/files/list): lstat's view, a symlink's target as stored.
type FileInfo struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Mode is an os.FileMode (type bits and permissions, as os.Lstat
	// reports them).
	Mode uint32 `json:"mode"`
	// MTime is the modification time in nanoseconds since the epoch.
	MTime int64  `json:"mtime"`
	Link  string `json:"link,omitempty"`
}

// Mkdir makes a directory and its missing parents (POST /v1/files/mkdir).
type Mkdir struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits; 0: 0755
}

// Rename renames From to To (POST /v1/files/rename), as rename(2).
type Rename struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Remove removes a path (POST /v1/files/remove).
type Remove struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// Bounds of the file calls.
const (
	// MaxPath is PATH_MAX without the NUL; MaxName is NAME_MAX.
	MaxPath = 4095
	MaxName = 255
	// MaxListEntries bounds one directory listing.
	MaxListEntries = 1 << 20
)

// modeBits are the os.FileMode bits a FileInfo may carry.
const modeBits = uint32(os.ModeType | os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)

// ErrPath is a path CleanPath refuses.
var ErrPath = errors.New("bad path")

// CleanPath validates an absolute sandbox path and cleans it lexically:
// "" is refused, as are relative paths, NUL bytes, paths longer than
// MaxPath or with a name longer than MaxName, and ".." that climbs above
// "/" (a path never escapes the root by its letters; symlinks in it are
// resolved by the sandbox's kernel, inside the sandbox). The result is
// absolute, without "." or ".." or repeated slashes ("/" for the root).
// Cleaning is lexical: "/a/b/../c" is "/a/c" even when b is a symlink, as
// Go's path.Clean and the host's confinedfs do.
func CleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: empty path", ErrPath)
	case p[0] != '/':
		return "", fmt.Errorf("%w: path must be absolute", ErrPath)
	case len(p) > MaxPath:
		return "", fmt.Errorf("%w: path too long", ErrPath)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: NUL in path", ErrPath)
	}
	var out []string
	for c := range strings.SplitSeq(p[1:], "/") {
		switch c {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return "", fmt.Errorf("%w: path escapes the root", ErrPath)
			}
			out = out[:len(out)-1]
		default:
			if len(c) > MaxName {
				return "", fmt.Errorf("%w: name too long", ErrPath)
			}
			out = append(out, c)
		}
	}
	return "/" + strings.Join(out, "/"), nil
}

// ValidName says whether name may be a FileInfo's name in a listing: one
// path component, not "." or "..".
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxName &&
		!strings.ContainsAny(name, "/\x00")
}

// Check validates a FileInfo that an agent answered (the host's side: it is
// the sandbox's word). want, when not "", is the name it must have.
func (fi FileInfo) Check(want string) error {
	switch {
	case want != "" && fi.Name != want:
		return fmt.Errorf("file info names %q, asked for %q", trunc(fi.Name), want)
	case want == "" && !ValidName(fi.Name):
		return fmt.Errorf("file info with bad name %q", trunc(fi.Name))
	case fi.Size < 0:
		return fmt.Errorf("file info %q with negative size", fi.Name)
	case fi.Mode&^modeBits != 0:
		return fmt.Errorf("file info %q with unknown mode bits %#o", fi.Name, fi.Mode&^modeBits)
	case len(fi.Link) > MaxPath || strings.IndexByte(fi.Link, 0) >= 0:
		return fmt.Errorf("file info %q with a bad link", fi.Name)
	case fi.Link != "" && os.FileMode(fi.Mode)&os.ModeSymlink == 0:
		return fmt.Errorf("file info %q: a link target on a file that is not a symlink", fi.Name)
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
