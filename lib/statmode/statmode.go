// Package statmode converts a stat(2) st_mode into an os.FileMode, as
// os.Lstat does: for code that stats with the *at calls (a file resolved one
// name at a time, or inside a sandbox) and still answers in Go's terms. The
// agent inside the sandbox and the host's confined file system share it, so
// a file reads the same through either.
package statmode

import (
	"os"

	"golang.org/x/sys/unix"
)

// FileMode converts m, a st_mode, to an os.FileMode.
func FileMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		fm |= os.ModeDevice
	case unix.S_IFCHR:
		fm |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFDIR:
		fm |= os.ModeDir
	case unix.S_IFIFO:
		fm |= os.ModeNamedPipe
	case unix.S_IFLNK:
		fm |= os.ModeSymlink
	case unix.S_IFSOCK:
		fm |= os.ModeSocket
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}
