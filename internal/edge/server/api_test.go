package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

func TestMain(m *testing.M) { enginetest.Main(m) }

const testKey = "amber_test_admin_key_0123456789abcdef"

// newAPI serves a real engine and returns a client with the admin key.
func newAPI(t *testing.T) (*client.Client, *enginetest.Env, string) {
	t.Helper()
	return newAPIWith(t, engine.Options{})
}

func newAPIWith(t *testing.T, opts engine.Options) (*client.Client, *enginetest.Env, string) {
	t.Helper()
	env := enginetest.New(t, opts)
	key := testKey
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Version: "test"}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, key)
	if err != nil {
		t.Fatal(err)
	}
	return c, env, ts.URL
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestSandboxExecFilesProcessesEvents(t *testing.T) {
	c, _, _ := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Limits: api.Limits{MemoryBytes: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "running" || sb.Limits.MemoryBytes != 128<<20 || sb.Tenant != "default" {
		t.Fatalf("created %+v", sb)
	}
	if l, err := c.ListSandboxes(ctx); err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Fatalf("list: %+v %v", l, err)
	}

	t.Run("exec", func(t *testing.T) {
		var out, errb bytes.Buffer
		st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}}, nil, &out, &errb)
		if err != nil || st.Code != 7 || out.String() != "out\n" || errb.String() != "err\n" {
			t.Fatalf("exec: %+v %v %q %q", st, err, out.String(), errb.String())
		}
		out.Reset()
		st, err = c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"cat"}, Stdin: []byte("json stdin")}, nil, &out, nil)
		if err != nil || out.String() != "json stdin" {
			t.Fatalf("exec with stdin field: %+v %v %q", st, err, out.String())
		}
		out.Reset()
		st, err = c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"tr", "a-z", "A-Z"}}, strings.NewReader("streamed"), &out, nil)
		if err != nil || out.String() != "STREAMED" {
			t.Fatalf("exec with streamed stdin: %+v %v %q", st, err, out.String())
		}
		st, err = c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sleep", "10"}, TimeoutMS: 300}, nil, nil, nil)
		if err != nil || !st.TimedOut {
			t.Fatalf("exec timeout: %+v %v", st, err)
		}
		_, err = c.Exec(ctx, sb.ID, api.ExecRequest{}, nil, nil, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("exec without args: %v", err)
		}
	})

	t.Run("files", func(t *testing.T) {
		if err := c.Mkdir(ctx, sb.ID, "/work", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, sb.ID, "/work/a.txt", strings.NewReader("hello"), 0o600); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := c.ReadFile(ctx, sb.ID, "/work/a.txt", &buf); err != nil || buf.String() != "hello" {
			t.Fatalf("read: %q %v", buf.String(), err)
		}
		fi, err := c.Stat(ctx, sb.ID, "/work/a.txt")
		if err != nil || fi.Type != "file" || fi.Size != 5 || fi.Mode != "0600" {
			t.Fatalf("stat: %+v %v", fi, err)
		}
		ents, err := c.List(ctx, sb.ID, "/work")
		if err != nil || len(ents) != 1 || ents[0].Name != "a.txt" {
			t.Fatalf("list: %+v %v", ents, err)
		}
		// The sandbox sees what the API wrote.
		var out bytes.Buffer
		c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"cat", "/work/a.txt"}}, nil, &out, nil)
		if out.String() != "hello" {
			t.Fatalf("sandbox reads %q", out.String())
		}
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Name: "sub/b.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
		tw.Write([]byte("tar"))
		tw.Close()
		if err := c.TarIn(ctx, sb.ID, "/work", &tb); err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		if err := c.ReadFile(ctx, sb.ID, "/work/sub/b.txt", &buf); err != nil || buf.String() != "tar" {
			t.Fatalf("file from tar: %q %v", buf.String(), err)
		}
		var tout bytes.Buffer
		if err := c.TarOut(ctx, sb.ID, "/work", &tout); err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		tr := tar.NewReader(&tout)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names[strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "work/")] = true
		}
		if !names["a.txt"] || !names["sub/b.txt"] {
			t.Fatalf("tar out has %v", names)
		}
		if err := c.Remove(ctx, sb.ID, "/work", true); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Stat(ctx, sb.ID, "/work"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stat after remove: %v", err)
		}
		if err := c.ReadFile(ctx, sb.ID, "/../../etc/shadow", io.Discard); err == nil {
			t.Fatal("read outside the sandbox's tree succeeded")
		}
	})

	t.Run("processes", func(t *testing.T) {
		pid, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "300"}})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := c.Processes(ctx, sb.ID)
		if err != nil || !hasPID(ps, pid) {
			t.Fatalf("processes: %+v %v (want pid %d)", ps, err, pid)
		}
		if err := c.Signal(ctx, sb.ID, pid, "KILL"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for ps, _ = c.Processes(ctx, sb.ID); hasPID(ps, pid); ps, _ = c.Processes(ctx, sb.ID) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d survived SIGKILL: %+v", pid, ps)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := c.Signal(ctx, sb.ID, pid, "NOPE"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("bad signal: %v", err)
		}
		if st, err := c.Wait(ctx, sb.ID, pid); err != nil || st.Signal != "SIGKILL" || st.Code != 137 {
			t.Fatalf("wait for the killed process: %+v %v", st, err)
		}
		pid, err = c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sh", "-c", "sleep 1; exit 6"}})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := c.Wait(ctx, sb.ID, pid); err != nil || st != (api.ExitStatus{Code: 6}) {
			t.Fatalf("wait: %+v %v, want exit 6", st, err)
		}
		if _, err := c.Wait(ctx, sb.ID, 99999); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("wait for a pid never started: %v", err)
		}
		if _, err := c.Wait(ctx, sb.ID, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("wait for pid 0: %v", err)
		}
		// A client that stops waiting gets its context's error; the
		// process runs on.
		pid, err = c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "300"}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = c.Wait(wctx, sb.ID, pid)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait with a deadline: %v", err)
		}
		if ps, err := c.Processes(ctx, sb.ID); err != nil || !hasPID(ps, pid) {
			t.Fatalf("processes after a cancelled wait: %+v %v (want pid %d)", ps, err, pid)
		}
	})

	if _, err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}}, nil, nil, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec in killed sandbox: %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	evs, err := c.Events(ctx, sb.ID, 1, 0)
	var types []string
	for _, ev := range evs.Events {
		types = append(types, ev.Type)
	}
	if err != nil || strings.Join(types, ",") != "sandbox.created,sandbox.started,sandbox.killed,sandbox.destroyed" || evs.Next != 5 {
		t.Fatalf("events: %v %v next %d", types, err, evs.Next)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "destroyed" {
		t.Fatalf("get destroyed: %+v %v", got, err)
	}
}

func hasPID(ps []api.Process, pid int) bool {
	for _, p := range ps {
		if p.PID == pid {
			return true
		}
	}
	return false
}

func TestErrorsOverTheWire(t *testing.T) {
	c, _, url := newAPI(t)
	ctx := ctxT(t)
	_, err := c.GetSandbox(ctx, "sbx-doesnotexist")
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Kind != "not found" || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get missing: %#v", err)
	}
	_, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "no-such-template"})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("unknown template: %v", err)
	}
	_, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Limits: api.Limits{MemoryBytes: -1}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("negative memory: %v", err)
	}
	bad, _ := client.New(url, "wrong")
	if _, err := bad.ListSandboxes(ctx); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("wrong key: %v", err)
	}
	if tl, err := c.Templates(ctx); err != nil || len(tl) == 0 {
		t.Fatalf("templates: %+v %v", tl, err)
	}
	if info, err := c.Info(ctx); err != nil || info.Tenant != "default" || info.Driver != enginetest.DriverName() {
		t.Fatalf("info: %+v %v", info, err)
	}
}

// TestWatchFiles: a watch through the API sees what the sandbox's own
// processes (an exec) and the files API do under the path, as they happen.
func TestWatchFiles(t *testing.T) {
	c, _, base := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"mkdir", "-p", "/root/watched"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("mkdir: %+v %v", st, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(wctx, "GET", base+"/v1/sandboxes/"+sb.ID+"/files/watch?path=/root/watched&recursive=true", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("watch: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "mkdir /root/watched/sub && sleep 0.2 && echo x > /root/watched/sub/f"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("exec: %+v %v", st, err)
	}
	want := map[string]bool{"/root/watched/sub create": false, "/root/watched/sub/f write": false}
	dec := json.NewDecoder(resp.Body)
	for n := 0; n < len(want); {
		var e api.WatchEvent
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("watch stream: %v (seen %v)", err, want)
		}
		if seen, ok := want[e.Path+" "+e.Op]; ok && !seen {
			want[e.Path+" "+e.Op] = true
			n++
		}
	}
	// A relative or missing path is refused.
	for _, q := range []string{"", "path=/no/such/dir"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/sandboxes/"+sb.ID+"/files/watch?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("watch ?%s: %d, want a 4xx", q, resp.StatusCode)
		}
	}
}

// TestProcessOutputFollows: a followed output stream delivers each line as
// the process writes it (not at its end), and a client that re-attaches
// from its offset gets the rest without a repeat.
func TestProcessOutputFollows(t *testing.T) {
	c, _, _ := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var first time.Duration
	var got strings.Builder
	stop := errors.New("enough")
	var off int64
	err = c.ProcessOutput(ctx, sb.ID, pid, 0, true, func(f api.OutputFrame) error {
		if f.Stream == "stdout" {
			if first == 0 {
				first = time.Since(start)
			}
			got.Write(f.Data)
			off = f.Offset + int64(len(f.Data))
			if strings.Count(got.String(), "\n") == 2 {
				return stop
			}
		}
		return nil
	})
	if !errors.Is(err, stop) || first > 3*time.Second {
		t.Fatalf("follow: %v; first output after %v (the process writes a line a second)", err, first)
	}
	var exit *api.ExitStatus
	err = c.ProcessOutput(ctx, sb.ID, pid, off, true, func(f api.OutputFrame) error {
		if f.Stream == "stdout" {
			got.Write(f.Data)
		}
		if f.Stream == "exited" {
			exit = f.Exit
		}
		return nil
	})
	if err != nil || exit == nil || exit.Code != 0 || got.String() != "line1\nline2\nline3\nline4\nline5\n" {
		t.Fatalf("re-attached at %d: %v %+v %q", off, err, exit, got.String())
	}
}
