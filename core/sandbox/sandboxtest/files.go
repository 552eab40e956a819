package sandboxtest

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// testFiles: every FS call, and coherence between the host's view (FS)
// and the sandbox's (exec) in both directions, without delay.
func (s *suite) testFiles(t *testing.T) {
	id := s.create(t, "files", sandbox.Limits{})
	fs := s.files(t, id)
	ctx := ctxFor(t, callTimeout*5)

	if err := fs.Mkdir(ctx, "/data/sub", 0o755); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if fi, err := fs.Stat(ctx, "/data/sub"); err != nil || !fi.Mode.IsDir() || fi.Name != "sub" {
		t.Errorf("Stat dir = %+v, %v", fi, err)
	}
	writeFile(t, fs, "/data/sub/a.txt", "hello", 0o640)
	fi, err := fs.Stat(ctx, "/data/sub/a.txt")
	if err != nil || fi.Size != 5 || fi.Mode.Perm() != 0o640 || !fi.Mode.IsRegular() || fi.ModTime.IsZero() {
		t.Errorf("Stat file = %+v, %v; want 5 bytes, 0640", fi, err)
	}
	if got, err := readFile(t, fs, "/data/sub/a.txt"); err != nil || got != "hello" {
		t.Errorf("ReadFile = %q, %v", got, err)
	}
	list, err := fs.List(ctx, "/data/sub")
	if err != nil || len(list) != 1 || list[0].Name != "a.txt" || list[0].Size != 5 {
		t.Errorf("List = %+v, %v", list, err)
	}

	// Host → sandbox, at once.
	if out := s.sh(t, id, "cat /data/sub/a.txt; stat -c %a /data/sub/a.txt"); out != "hello640\n" {
		t.Errorf("sandbox reads %q, want the host's write", out)
	}
	// Sandbox → host, at once; /tmp included.
	s.sh(t, id, "echo from-sandbox > /data/b.txt; echo tmp > /tmp/t1; ln -s sub/a.txt /data/link")
	if got, err := readFile(t, fs, "/data/b.txt"); err != nil || got != "from-sandbox\n" {
		t.Errorf("host reads %q, %v; want the sandbox's write", got, err)
	}
	if got, err := readFile(t, fs, "/tmp/t1"); err != nil || got != "tmp\n" {
		t.Errorf("host reads /tmp/t1 = %q, %v", got, err)
	}
	if fi, err := fs.Stat(ctx, "/data/link"); err != nil || fi.Link != "sub/a.txt" || fi.Mode&os.ModeSymlink == 0 {
		t.Errorf("Stat symlink = %+v, %v", fi, err)
	}
	if got, err := readFile(t, fs, "/data/link"); err != nil || got != "hello" {
		t.Errorf("ReadFile through a relative symlink = %q, %v", got, err)
	}

	// The sandbox has read a file and listed a directory; the host then
	// changes both. No stale view inside.
	s.sh(t, id, "cat /data/sub/a.txt >/dev/null; ls /data >/dev/null")
	writeFile(t, fs, "/data/sub/a.txt", "second version, longer", 0o644)
	writeFile(t, fs, "/data/new.txt", "new", 0o644)
	if out := s.sh(t, id, "cat /data/sub/a.txt; echo; ls /data | tr '\\n' ' '"); out != "second version, longer\nb.txt link new.txt sub " {
		t.Errorf("after host rewrite the sandbox sees %q", out)
	}
	if err := fs.Remove(ctx, "/data/new.txt", false); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if r := s.shStatus(t, id, "test -e /data/new.txt"); r.Code == 0 {
		t.Errorf("sandbox still sees a file the host removed")
	}
	// And the other way: the sandbox rewrites and removes.
	s.sh(t, id, "echo rewritten-inside > /data/sub/a.txt; rm /data/b.txt")
	if got, err := readFile(t, fs, "/data/sub/a.txt"); err != nil || got != "rewritten-inside\n" {
		t.Errorf("host reads %q, %v after the sandbox rewrote", got, err)
	}
	if _, err := fs.Stat(ctx, "/data/b.txt"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat of a file the sandbox removed = %v, want not found", err)
	}

	// Tar round trip: out of /data, into /restore.
	s.sh(t, id, "mkdir -p /data/deep/er && head -c 1000 /dev/zero | tr '\\0' x > /data/deep/er/k.bin && chmod 600 /data/deep/er/k.bin")
	var tarball bytes.Buffer
	if err := fs.TarOut(ctx, "/data", &tarball); err != nil {
		t.Fatalf("TarOut: %v", err)
	}
	if err := fs.TarIn(ctx, "/restore", bytes.NewReader(tarball.Bytes())); err != nil {
		t.Fatalf("TarIn: %v", err)
	}
	out := s.sh(t, id, `cd /restore && for f in $(find . -type f -o -type l | sort); do echo "$f $(stat -c %a "$f") $(cat "$f" | md5sum | cut -c1-8)"; done`)
	for _, want := range []string{"/sub/a.txt 644 ", "/deep/er/k.bin 600 ", "/link 777 "} {
		if !strings.Contains(out, want) {
			t.Errorf("after TarOut/TarIn, /restore lacks %q:\n%s", want, out)
		}
	}
	if s.sh(t, id, "cat $(find /restore -name k.bin)") != strings.Repeat("x", 1000) {
		t.Errorf("k.bin changed in the round trip")
	}

	s.checkRename(t, id, fs)
	s.checkTmpfs(t, id, fs)

	// Remove: non-recursive on a non-empty dir fails; recursive works.
	if err := fs.Remove(ctx, "/data", false); err == nil {
		t.Errorf("Remove of a non-empty directory without recursive succeeded")
	}
	if err := fs.Remove(ctx, "/data", true); err != nil {
		t.Fatalf("Remove recursive: %v", err)
	}
	if r := s.shStatus(t, id, "test -e /data"); r.Code == 0 {
		t.Errorf("sandbox still sees /data after Remove")
	}
	if _, err := fs.Stat(ctx, "/data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after Remove = %v, want not found", err)
	}
	if _, err := readFile(t, fs, "/no/such/file"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile of a missing file = %v, want not found", err)
	}
	root, err := fs.List(ctx, "/")
	if err != nil || !slices.ContainsFunc(root, func(fi sandbox.FileInfo) bool { return fi.Name == "bin" }) {
		t.Errorf("List / = %+v, %v", root, err)
	}
}

// checkRename: Rename of a file, over a file, of a directory; a missing
// source, a relative path, a lexical ".." above "/", a directory over a
// non-empty one refused; a rename through a symlink that climbs out stays
// inside. The sandbox sees each rename at once.
func (s *suite) checkRename(t *testing.T, id string, fs sandbox.FS) {
	ctx := ctxFor(t, callTimeout*5)
	writeFile(t, fs, "/data/r1", "one", 0o644)
	if err := fs.Rename(ctx, "/data/r1", "/data/r2"); err != nil {
		t.Fatalf("Rename of a file: %v", err)
	}
	writeFile(t, fs, "/data/r3", "three", 0o600)
	if err := fs.Rename(ctx, "/data/r3", "/data/r2"); err != nil {
		t.Fatalf("Rename over a file: %v", err)
	}
	if err := fs.Rename(ctx, "/data/deep", "/data/deeper"); err != nil {
		t.Fatalf("Rename of a directory: %v", err)
	}
	if out := s.sh(t, id, "cat /data/r2; test -e /data/r1 || echo ' r1 gone'; test -e /data/r3 || echo r3 gone; stat -c %a /data/r2; wc -c < /data/deeper/er/k.bin; test -e /data/deep || echo deep gone"); out != "three r1 gone\nr3 gone\n600\n1000\ndeep gone\n" {
		t.Errorf("after the renames the sandbox sees %q", out)
	}
	s.sh(t, id, "mkdir -p /data/full/x && ln -s ../../../../../.. /data/up")
	for _, tc := range []struct {
		from, to string
		kind     error
	}{
		{"/data/no-such", "/data/x", errdefs.ErrNotFound},
		{"data/r2", "/data/x", errdefs.ErrInvalidArgument},
		{"/data/r2", "x", errdefs.ErrInvalidArgument},
		{"/data/r2", "/data/../../../../r2", errdefs.ErrInvalidArgument},
		{"/data/deeper", "/data/full", errdefs.ErrFailedPrecondition},
		{"/data/deeper", "/data/r2", errdefs.ErrInvalidArgument},
		{"/", "/data/x", errdefs.ErrInvalidArgument},
	} {
		if err := fs.Rename(ctx, tc.from, tc.to); !errors.Is(err, tc.kind) {
			t.Errorf("Rename(%q, %q) = %v, want %v", tc.from, tc.to, err, tc.kind)
		}
	}
	// Through a symlink that climbs above the root: it lands at the
	// sandbox's root, never the host's.
	marker := randToken("renamed")
	writeFile(t, fs, "/data/"+marker, "m", 0o644)
	if err := fs.Rename(ctx, "/data/"+marker, "/data/up/"+marker); err != nil {
		t.Fatalf("Rename through /data/up: %v", err)
	}
	if _, err := os.Lstat("/" + marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Rename through a climbing symlink made the host's /%s", marker)
		_ = os.Remove("/" + marker)
	}
	if out := s.sh(t, id, "cat /"+marker+" && rm /"+marker); out != "m" {
		t.Errorf("the renamed file inside: %q", out)
	}
}

// checkTmpfs: a file in a tmpfs of the sandbox (/dev/shm; /dev is one in
// both drivers' sandboxes) — where the host's view of the layer cannot see
// — is read, listed, written and renamed like any other.
func (s *suite) checkTmpfs(t *testing.T, id string, fs sandbox.FS) {
	ctx := ctxFor(t, callTimeout*5)
	s.sh(t, id, "mkdir -p /dev/shm && echo in-tmpfs > /dev/shm/amber-t")
	if got, err := readFile(t, fs, "/dev/shm/amber-t"); err != nil || got != "in-tmpfs\n" {
		t.Errorf("ReadFile of a file in the sandbox's tmpfs = %q, %v", got, err)
	}
	if list, err := fs.List(ctx, "/dev/shm"); err != nil || !slices.ContainsFunc(list, func(fi sandbox.FileInfo) bool { return fi.Name == "amber-t" }) {
		t.Errorf("List /dev/shm = %+v, %v", list, err)
	}
	writeFile(t, fs, "/dev/shm/amber-w", "from-host", 0o644)
	if err := fs.Rename(ctx, "/dev/shm/amber-w", "/dev/shm/amber-w2"); err != nil {
		t.Errorf("Rename in the tmpfs: %v", err)
	}
	if out := s.sh(t, id, "cat /dev/shm/amber-w2; rm -f /dev/shm/amber-t /dev/shm/amber-w2"); out != "from-host" {
		t.Errorf("the sandbox reads %q from its tmpfs", out)
	}
}

// HostSideFiles checks the files of a sandbox that has no agent (one made,
// or checkpointed, before it), served host-side over its layer: a write and
// a rename through fs are seen inside at once and read back; a file only
// in the sandbox's tmpfs (/dev/shm) is not found, which tells the
// host-side view from the agent's. sh runs a script in the sandbox and
// returns its output. Drivers call it from their tests of such sandboxes.
func HostSideFiles(t *testing.T, fs sandbox.FS, sh func(script string) string) {
	t.Helper()
	ctx := ctxFor(t, callTimeout*5)
	writeFile(t, fs, "/root/legacy-a", "legacy", 0o640)
	if err := fs.Rename(ctx, "/root/legacy-a", "/root/legacy-b"); err != nil {
		t.Fatalf("Rename in a sandbox without the agent: %v", err)
	}
	if out := sh("cat /root/legacy-b; test -e /root/legacy-a || echo ' moved'"); out != "legacy moved\n" {
		t.Errorf("the sandbox sees %q after the host's write and rename", out)
	}
	sh("echo inside > /root/legacy-c; mkdir -p /dev/shm && echo shm > /dev/shm/legacy")
	if got, err := readFile(t, fs, "/root/legacy-c"); err != nil || got != "inside\n" {
		t.Errorf("ReadFile of the sandbox's write = %q, %v", got, err)
	}
	if _, err := readFile(t, fs, "/dev/shm/legacy"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile of a tmpfs file of a sandbox without the agent = %v; want not found (the host's view)", err)
	}
	if err := fs.Remove(ctx, "/root/legacy-b", false); err != nil {
		t.Error(err)
	}
}
