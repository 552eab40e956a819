package statmode

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FileMode agrees with os.Lstat on a file, a directory, a symlink, a FIFO
// and a setuid, setgid and sticky file.
func TestFileModeIsLstats(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o640|os.ModeSetuid|os.ModeSetgid|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "p"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f", "l", "p", "."} {
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if got := FileMode(st.Mode); got != fi.Mode() {
			t.Errorf("%s: FileMode = %v, os.Lstat says %v", name, got, fi.Mode())
		}
	}
}
