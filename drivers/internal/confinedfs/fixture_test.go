package confinedfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fixture is a host directory holding a sandbox root and, beside it, an
// "outside" directory with a marker file whose content must never come out
// of the FS, and which no operation may change.
//
//	HOST/outside/marker        the host's secret (marker content)
//	HOST/root/                 the sandbox's root
//	  etc/passwd, etc/shadow   the sandbox's own
//	  home/user/
//	  etclink -> /etc          absolute: must mean the ROOT's /etc
//	  climb -> ../../../../../../../../..   relative, climbs above the root
//	  sibling -> ../outside    relative, to the host directory beside the root
//	  hostabs -> HOST/outside  absolute, naming the host directory
//	  loop1 -> loop2, loop2 -> loop1
type fixture struct {
	host, root, outside string
	marker              []byte
	fs                  *FS
}

func newFixture(t testing.TB, opts ...Option) *fixture {
	t.Helper()
	host := t.TempDir()
	fx := &fixture{
		host:    host,
		root:    filepath.Join(host, "root"),
		outside: filepath.Join(host, "outside"),
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	fx.marker = []byte("HOST-SECRET-" + hex.EncodeToString(b[:]))
	mustMkdir(t, fx.outside, fx.root+"/etc", fx.root+"/home/user")
	mustWrite(t, filepath.Join(fx.outside, "marker"), fx.marker)
	mustWrite(t, filepath.Join(fx.root, "etc/passwd"), []byte("sandbox passwd\n"))
	mustWrite(t, filepath.Join(fx.root, "etc/shadow"), []byte("sandbox shadow\n"))
	for name, target := range map[string]string{
		"etclink": "/etc",
		"climb":   strings.Repeat("../", 9),
		"sibling": "../outside",
		"hostabs": fx.outside,
		"loop1":   "loop2",
		"loop2":   "loop1",
	} {
		if err := os.Symlink(target, filepath.Join(fx.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := New(fx.root, opts...)
	if err != nil {
		t.Fatal(err)
	}
	fx.fs = fs
	return fx
}

// checkOutside fails the test if the outside directory changed: the marker
// must be intact and alone.
func (fx *fixture) checkOutside(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir(fx.outside)
	if err != nil {
		t.Fatalf("outside dir: %v", err)
	}
	if len(ents) != 1 || ents[0].Name() != "marker" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("outside dir changed: %v", names)
	}
	b, err := os.ReadFile(filepath.Join(fx.outside, "marker"))
	if err != nil || !bytes.Equal(b, fx.marker) {
		t.Fatalf("outside marker changed: %q %v", b, err)
	}
}

// checkErr fails if err leaks a host path that is not part of the tenant's
// own path p. (Errorf, not Fatalf: it is called from goroutines.)
func (fx *fixture) checkErr(t testing.TB, err error, p ...string) {
	t.Helper()
	if err == nil {
		return
	}
	// The message may quote the tenant's path (escaped, or cut), which may
	// itself name host paths: a leak is any host path beyond those.
	allowed := 0
	for _, q := range p {
		allowed += strings.Count(q, fx.host)
	}
	if strings.Count(err.Error(), fx.host) > allowed {
		t.Errorf("error leaks the host path: %v", err)
	}
}

func (fx *fixture) read(t testing.TB, p string) ([]byte, error) {
	t.Helper()
	var buf bytes.Buffer
	err := fx.fs.ReadFile(context.Background(), p, &buf)
	fx.checkErr(t, err, p)
	if bytes.Contains(buf.Bytes(), fx.marker) {
		t.Errorf("ReadFile(%q) returned the host's marker", p)
	}
	return buf.Bytes(), err
}

func mustMkdir(t testing.TB, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func mustWrite(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantKind(t testing.TB, err, kind error, what string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s: got %v, want kind %q", what, err, kind)
	}
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func statOwner(t testing.TB, p string) (uint32, uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid, st.Mode
}
