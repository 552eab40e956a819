package writebehind

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Write-behind starts writeback of every file while it is written, ends at
// Stop (twice is fine), and Dir closes the files it opened.
func TestWriteBehind(t *testing.T) {
	dir := t.TempDir()
	a, err := os.Create(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	w := Files([]*os.File{a}, time.Millisecond)
	d := Dir(dir, time.Millisecond)
	fdsBefore := openFDs(t)
	chunk := make([]byte, 1<<20)
	for i := range 16 {
		if _, err := a.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if i == 4 {
			if err := os.WriteFile(filepath.Join(dir, "b"), chunk, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	w.Stop()
	w.Stop()
	d.Stop()
	if w.Started() == 0 {
		t.Fatal("no writeback started for the file")
	}
	// Dir saw both files: more calls than ticks with one file would give
	// is not guaranteed, so look at what it holds open: nothing after Stop.
	if d.Started() < 2 {
		t.Fatalf("dir write-behind started %d writebacks", d.Started())
	}
	if after := openFDs(t); after > fdsBefore {
		t.Fatalf("%d descriptors open after Stop, %d before", after, fdsBefore)
	}
	// The writes are intact (write-behind never writes).
	for _, n := range []string{"a", "b"} {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.Size() == 0 {
			t.Fatalf("%s: %v %v", n, fi, err)
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); !strings.HasPrefix(l, "anon_inode:") {
			n++
		}
	}
	return n
}
