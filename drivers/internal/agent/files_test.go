package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
	"github.com/amber-run/amber/lib/agentproto"
)

// TestFilesThroughAgent runs the agent on the host (its "sandbox" is the
// host's root, so paths are host paths under a temporary directory) and
// checks every file call's semantics and error kinds against the contract
// confinedfs implements.
func TestFilesThroughAgent(t *testing.T) {
	c, _ := hostAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := func(s string) string { return dir + s }
	if ok, err := c.ServesFiles(ctx); err != nil || !ok {
		t.Fatalf("ServesFiles = %v, %v", ok, err)
	}
	if err := c.WriteFile(ctx, p("/a/b/f.txt"), strings.NewReader("hello"), 0o640); err != nil {
		t.Fatalf("write (parents made): %v", err)
	}
	if fi, err := os.Stat(p("/a/b/f.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("written file: %v %v", fi, err)
	}
	if fi, err := os.Stat(p("/a/b")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("made parent: %v %v", fi, err)
	}
	var b bytes.Buffer
	if err := c.ReadFile(ctx, p("/a/b/f.txt"), 0, &b); err != nil || b.String() != "hello" {
		t.Fatalf("read = %q, %v", b.String(), err)
	}
	if err := c.ReadFile(ctx, p("/a/b/f.txt"), 4, io.Discard); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("read over the cap = %v, want too large", err)
	}
	if err := c.WriteFile(ctx, p("/a/b/f.txt"), strings.NewReader("x"), os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p("/a/b/f.txt")); fi.Mode()&os.ModeSetuid != 0 {
		t.Fatalf("set-uid bit kept: %v", fi.Mode())
	}
	// A body that breaks off mid-way leaves the old file, and no
	// temporary file: checked at the end of the test, because the agent's
	// handler of the broken stream may run after the client has given up
	// (its temporary file appears, then goes).
	if err := c.WriteFile(ctx, p("/cut/f.txt"), strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := c.WriteFile(ctx, p("/cut/f.txt"), io.MultiReader(strings.NewReader(strings.Repeat("y", 100000)), errReader{}), 0o644)
	if err == nil || !strings.Contains(err.Error(), "cut") {
		t.Fatalf("write with a failing body = %v", err)
	}
	defer eventually(t, func() bool {
		got, _ := os.ReadFile(p("/cut/f.txt"))
		ents, _ := os.ReadDir(p("/cut"))
		return string(got) == "x" && len(ents) == 1
	})

	if err := os.Symlink("f.txt", p("/a/b/link")); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat(ctx, p("/a/b/link"))
	if err != nil || fi.Link != "f.txt" || os.FileMode(fi.Mode)&os.ModeSymlink == 0 || fi.Name != "link" {
		t.Fatalf("stat of a symlink = %+v, %v", fi, err)
	}
	list, err := c.List(ctx, p("/a/b"))
	if err != nil || len(list) != 2 || list[0].Name != "f.txt" || list[1].Name != "link" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if err := c.Mkdir(ctx, p("/a/b/f.txt/sub"), 0o755); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("mkdir under a file = %v, want already exists", err)
	}
	if err := os.Symlink(p("/nowhere"), p("/dangling")); err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, p("/dangling/sub"), 0o755); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mkdir through a dangling symlink = %v, want not found (as confinedfs)", err)
	}
	if err := c.WriteFile(ctx, p("/dangling/f"), strings.NewReader("x"), 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("write through a dangling symlink = %v, want not found", err)
	}
	if err := c.Mkdir(ctx, p("/m/n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, p("/m/n"), 0o700); err != nil {
		t.Fatalf("mkdir of an existing directory = %v", err)
	}

	// Rename: a file, over a file, a directory, refusals.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Rename(ctx, p("/a/b/f.txt"), p("/m/g.txt")))
	must(c.WriteFile(ctx, p("/m/h.txt"), strings.NewReader("h"), 0))
	must(c.Rename(ctx, p("/m/h.txt"), p("/m/g.txt")))
	if got, _ := os.ReadFile(p("/m/g.txt")); string(got) != "h" {
		t.Fatalf("rename over a file: %q", got)
	}
	must(c.Rename(ctx, p("/m/n"), p("/a/n2")))
	for _, tc := range []struct {
		from, to string
		kind     error
	}{
		{p("/no/such"), p("/x"), errdefs.ErrNotFound},
		{p("/m"), p("/a"), errdefs.ErrFailedPrecondition}, // a directory over a non-empty one
		{p("/m/g.txt"), p("/a"), errdefs.ErrInvalidArgument},
		{"relative", p("/x"), errdefs.ErrInvalidArgument},
		{p("/m/g.txt"), "/../../x", errdefs.ErrInvalidArgument},
		{"/", p("/x"), errdefs.ErrInvalidArgument},
	} {
		if err := c.Rename(ctx, tc.from, tc.to); !errors.Is(err, tc.kind) {
			t.Errorf("rename %s → %s = %v, want %v", tc.from, tc.to, err, tc.kind)
		}
	}

	// Remove.
	if err := c.Remove(ctx, p("/a"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("remove of a non-empty directory = %v", err)
	}
	must(c.Remove(ctx, p("/a/b/link"), false))
	must(c.Remove(ctx, p("/a"), true))
	if _, err := os.Lstat(p("/a")); !os.IsNotExist(err) {
		t.Fatalf("after a recursive remove: %v", err)
	}
	if err := c.Remove(ctx, p("/a"), true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove of a missing path = %v", err)
	}
	if _, err := c.Stat(ctx, p("/a")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat of a missing path = %v", err)
	}
	if err := c.ReadFile(ctx, dir, 0, io.Discard); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read of a directory = %v", err)
	}
	if err := c.ReadFile(ctx, "/dev/null", 0, io.Discard); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read of a device = %v", err)
	}
	for _, p := range []string{"/proc/self/environ", "/proc/1/environ", "/proc/meminfo"} {
		if err := c.ReadFile(ctx, p, 0, io.Discard); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("read of %s = %v, want permission denied (the agent's token is in its /proc)", p, err)
		}
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("cut") }

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// oldAgent serves only the health call of protocol 1.0: an agent build
// from before the file calls, as a checkpoint may have recorded it.
func oldAgent(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"protocol":"1.0","build":"sha256:old","pid":1,"init":true}`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the host asked an agent of 1.0 for %s %s", r.Method, r.URL.Path)
		http.NotFound(w, r)
	})
	return fakeAgent(t, mux)
}

// fakeAgent serves mux as an agent does (h2c on loopback) and returns a
// client of it.
func fakeAgent(t *testing.T, mux http.Handler) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &protos}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return New("old", "tok", func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
}

// TestFSFallsBack: an agent without the file calls, and a sandbox whose
// agent is gone, get their files from the host-side FS.
func TestFSFallsBack(t *testing.T) {
	root := t.TempDir()
	host, err := confinedfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := oldAgent(t)
	fs := &FS{Host: host, Agent: func(context.Context) *Client { return old }}
	checkHostFS(t, fs, root)

	// An agent that does not answer, in a sandbox that stopped.
	dead := New("dead", "tok", func(ctx context.Context) (net.Conn, error) {
		return nil, errors.New("connection refused")
	})
	dead.Alive = func(context.Context) error { return errdefs.FailedPreconditionf("sandbox dead is not running") }
	fs = &FS{Host: host, Agent: func(context.Context) *Client { return dead }}
	checkHostFS(t, fs, root)
	// The same agent in a sandbox that runs: the error, no fallback.
	dead.Alive = func(context.Context) error { return nil }
	if _, err := fs.Stat(ctx, "/"); !errdefs.IsUnavailable(err) {
		t.Fatalf("stat through an unavailable agent of a running sandbox = %v", err)
	}
	// No agent at all.
	fs = &FS{Host: host, Agent: func(context.Context) *Client { return nil }}
	checkHostFS(t, fs, root)
}

func checkHostFS(t *testing.T, fs sandbox.FS, root string) {
	t.Helper()
	ctx := context.Background()
	os.RemoveAll(filepath.Join(root, "d"))
	if err := fs.WriteFile(ctx, "/d/f", strings.NewReader("on the host"), 0o600); err != nil {
		t.Fatalf("write: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "d/f")); err != nil || string(b) != "on the host" {
		t.Fatalf("host file %q %v", b, err)
	}
	if err := fs.Rename(ctx, "/d/f", "/d/g"); err != nil {
		t.Fatalf("rename: %v", err)
	}
	var b bytes.Buffer
	if err := fs.ReadFile(ctx, "/d/g", &b); err != nil || b.String() != "on the host" {
		t.Fatalf("read %q %v", b.String(), err)
	}
	if l, err := fs.List(ctx, "/d"); err != nil || len(l) != 1 || l[0].Name != "g" {
		t.Fatalf("list %+v %v", l, err)
	}
	if err := fs.Mkdir(ctx, "/d/e", 0); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(ctx, "/d", true); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeList(t *testing.T) {
	good := `{"name":"a","size":1,"mode":420,"mtime":1}` + "\n" + `{"name":"b","size":0,"mode":134218239,"mtime":0,"link":"a"}` + "\n"
	if l, err := DecodeList(strings.NewReader(good)); err != nil || len(l) != 2 {
		t.Fatalf("good list: %+v %v", l, err)
	}
	for _, bad := range []string{
		`{"name":"b","mode":420}` + "\n" + `{"name":"a","mode":420}`, // out of order
		`{"name":"a"}` + "\n" + `{"name":"a"}`,                       // twice
		`{"name":"../x"}`, `{"name":"."}`, `{"name":"a/b"}`, `{"name":""}`,
		`{"name":"a","size":-1}`, `{"name":"a","mode":4294967295}`,
		`{"name":"a","mode":420,"link":"x"}`, // a link on a file
		`{"name":"a"`,
		`{"name":"` + strings.Repeat("x", agentproto.MaxJSON) + `"}`,
	} {
		if _, err := DecodeList(strings.NewReader(bad)); err == nil {
			t.Errorf("DecodeList(%.60q) succeeded", bad)
		}
	}
}

// FuzzDecodeList: whatever an agent answers to a listing, the decoder
// returns an error or entries that each pass agentproto's checks, in
// strictly increasing order.
func FuzzDecodeList(f *testing.F) {
	f.Add([]byte(`{"name":"a","size":1,"mode":420,"mtime":1}` + "\n" + `{"name":"b","mode":2147484141}` + "\n"))
	f.Add([]byte(`{"name":"l","mode":134218239,"link":"/etc/passwd"}`))
	f.Add([]byte("\n\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeList(bytes.NewReader(b))
		if err != nil {
			return
		}
		for i, fi := range l {
			if fi.Check("") != nil || (i > 0 && fi.Name <= l[i-1].Name) {
				t.Fatalf("entry %d accepted: %+v", i, fi)
			}
		}
	})
}

// TestCensusOfAnOlderAgent: an agent older than protocol 1.2 answers the
// census 404 (its mux has no such route): the call says NotImplemented, so
// the driver counts another way, rather than failing the restore.
func TestCensusOfAnOlderAgent(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"protocol":"1.1","build":"sha256:old","pid":1,"init":true}`))
	})
	_, err := fakeAgent(t, mux).Census(context.Background())
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("census of an agent of 1.1: %v, want NotImplemented", err)
	}
}
