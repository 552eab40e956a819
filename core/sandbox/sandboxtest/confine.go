package sandboxtest

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// testConfinement: FS paths resolve inside the sandbox whatever the path
// or the symlinks the sandbox planted say. A unique marker in a host file
// (and the host's /etc/hostname) must never come back, and nothing may be
// written, made or removed on the host.
func (s *suite) testConfinement(t *testing.T) {
	id := s.create(t, "confine", sandbox.Limits{})
	fs := s.files(t, id)
	ctx := ctxFor(t, 5*callTimeout)

	hostDir := t.TempDir()
	secret := randToken("HOST-SECRET")
	secretPath := filepath.Join(hostDir, "secret")
	if err := os.WriteFile(secretPath, []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostHostname, _ := os.ReadFile("/etc/hostname")
	sbxHostname := randToken("sandbox-hostname")

	// Planted by the sandbox itself.
	s.sh(t, id, strings.Join([]string{
		"echo " + sbxHostname + " > /etc/hostname",
		"ln -s /etc/hostname /l-abs",
		"ln -s ../../../../../../../../etc/hostname /l-rel",
		"ln -s / /l-root",
		"ln -s " + secretPath + " /l-secret",
		"ln -s " + hostDir + " /l-hostdir",
		"ln -s /proc/self/root/etc/hostname /l-proc",
		"ln -s /proc/1/root /l-proc1",
		"ln -s " + hostDir + "/victim /w-link",
		"mkdir -p /d && ln -s ../../../../.. /d/up",
	}, " && "))

	// Reads that must give the sandbox's file.
	for _, p := range []string{"/l-abs", "/l-rel", "/l-root/etc/hostname", "/d/up/etc/hostname", "/etc/hostname", "/etc/../../../etc/hostname"} {
		got, err := readFile(t, fs, p)
		switch {
		case strings.Contains(got, secret) || (len(hostHostname) > 0 && got == string(hostHostname) && got != sbxHostname+"\n"):
			t.Errorf("ReadFile(%q) returned a HOST file: %q", p, got)
		case err != nil && strings.Contains(p, ".."):
			// Refusing a lexical ".." is allowed.
			t.Logf("ReadFile(%q): %v (refused)", p, err)
		case err != nil || got != sbxHostname+"\n":
			t.Errorf("ReadFile(%q) = %q, %v; want the sandbox's /etc/hostname", p, got, err)
		}
	}
	// Reads that must fail (or at least never give host content).
	for _, p := range []string{"/l-secret", "/l-hostdir/secret", secretPath, "/l-proc", "/l-proc1/etc/hostname", "etc/hostname", "../etc/hostname"} {
		got, err := readFile(t, fs, p)
		if strings.Contains(got, secret) || (len(hostHostname) > 0 && got == string(hostHostname)) {
			t.Errorf("ReadFile(%q) returned a HOST file: %q", p, got)
		} else if err == nil && got != sbxHostname+"\n" {
			t.Errorf("ReadFile(%q) = %q with no error", p, got)
		}
	}
	if fi, err := fs.Stat(ctx, "/l-abs"); err != nil || fi.Link != "/etc/hostname" {
		t.Errorf("Stat(/l-abs) = %+v, %v; want the link as stored", fi, err)
	}
	if list, err := fs.List(ctx, "/l-hostdir"); err == nil {
		for _, fi := range list {
			if fi.Name == "secret" {
				t.Errorf("List(/l-hostdir) shows the host directory: %+v", list)
			}
		}
	}

	// Writes, mkdirs and removes through symlinks that point at the host.
	_ = fs.WriteFile(ctx, "/w-link", strings.NewReader("pwned"), 0o644)
	_ = fs.WriteFile(ctx, "/l-hostdir/victim2", strings.NewReader("pwned"), 0o644)
	_ = fs.WriteFile(ctx, filepath.Join(hostDir, "victim3"), strings.NewReader("pwned"), 0o644)
	_ = fs.Mkdir(ctx, "/l-hostdir/newdir", 0o755)
	_ = fs.Remove(ctx, "/l-secret", false) // removes the link, never the target
	_ = fs.Remove(ctx, "/l-hostdir/secret", false)
	_ = fs.Remove(ctx, "/l-hostdir", true)
	for _, name := range []string{"victim", "victim2", "victim3", "newdir"} {
		if _, err := os.Lstat(filepath.Join(hostDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("host %s/%s was created through the sandbox's FS (%v)", hostDir, name, err)
		}
	}
	if b, err := os.ReadFile(secretPath); err != nil || string(b) != secret+"\n" {
		t.Errorf("host secret changed or removed: %q %v", b, err)
	}

	// Tar archives that try to climb out.
	escapeName := randToken("escape")
	for _, entries := range [][]tarEntry{
		{{name: "../../../../../../tmp/" + escapeName, body: "x"}},
		{{name: "/" + escapeName, body: "x"}, {name: hostDir[1:] + "/" + escapeName, body: "x"}},
		{{name: "evil", link: hostDir}, {name: "evil/" + escapeName, body: "x"}},
		{{name: "rel", link: "../../../../../../../../" + hostDir[1:]}, {name: "rel/" + escapeName, body: "x"}},
		{{name: "hard", hardlink: secretPath}},
	} {
		_ = fs.TarIn(ctx, "/untar", bytes.NewReader(makeTar(t, entries)))
	}
	for _, p := range []string{"/tmp/" + escapeName, "/" + escapeName, filepath.Join(hostDir, escapeName)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("TarIn wrote host file %s (%v)", p, err)
			_ = os.Remove(p)
		}
	}
	if got, err := readFile(t, fs, "/untar/hard"); err == nil && strings.Contains(got, secret) {
		t.Errorf("TarIn hard link reached the host secret")
	}

	// TarOut through a symlink to a host directory.
	var out bytes.Buffer
	_ = fs.TarOut(ctx, "/l-hostdir", &out)
	_ = fs.TarOut(ctx, "/l-root", &out)
	if bytes.Contains(out.Bytes(), []byte(secret)) {
		t.Errorf("TarOut returned the host secret")
	}
	_ = fs.TarOut(ctx, "/", &out)
	if bytes.Contains(out.Bytes(), []byte(secret)) {
		t.Errorf("TarOut of / returned the host secret")
	}
	// The sandbox's own view is what it should be.
	if got := s.sh(t, id, "cat /l-abs"); got != sbxHostname+"\n" {
		t.Errorf("inside, /l-abs reads %q", got)
	}
}

type tarEntry struct {
	name, body, link, hardlink string
}

func makeTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		case e.hardlink != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, e.hardlink, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
