package server_test

// The everyday calls of an agent builder (issue 22 §2): a shell command
// line as well as an argv, a missing program's 127 at once, bad env and
// NUL bytes refused as 400s, background processes' stdin, absolute paths
// only, no file writes into /proc, a case-insensitive Bearer, a stalled
// body that does not hold its connection, and exec and the terminal
// waking an idle sandbox.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
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

// newAPILimits is newAPIWith with the server's Limits.
func newAPILimits(t *testing.T, opts engine.Options, lim server.Limits) (*client.Client, *enginetest.Env, string) {
	t.Helper()
	env := enginetest.New(t, opts)
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Version: "test", Limits: lim}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, testKey)
	if err != nil {
		t.Fatal(err)
	}
	return c, env, ts.URL
}

// rawCall makes one call with the admin key, the header's scheme spelled
// as given, and returns the status and body.
func rawCall(t *testing.T, ctx context.Context, method, url, scheme, ctype string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", scheme+" "+testKey)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEverydayExec(t *testing.T) {
	c, _, base := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo one two three | wc -w; exit 3"}, nil, &out, nil)
	if err != nil || st.Code != 3 || strings.TrimSpace(out.String()) != "3" {
		t.Fatalf("exec of a shell command line: %+v %v %q", st, err, out.String())
	}
	out.Reset()
	st, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "tr a-z A-Z | tr -d ' '"}, strings.NewReader("stream ed"), &out, nil)
	if err != nil || st.Code != 0 || out.String() != "STREAMED" {
		t.Fatalf("streamed exec of a shell command line: %+v %v %q", st, err, out.String())
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}, Cmd: "true"}, nil, nil, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("exec with both args and cmd: %v, want a 400", err)
	}

	// A program that is not there: exit 127 at once, its reason on stderr.
	for _, args := range [][]string{{"no-such-program"}, {"/no/such/program"}} {
		var errb bytes.Buffer
		start := time.Now()
		st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: args}, nil, nil, &errb)
		if err != nil || st.Code != 127 || errb.Len() == 0 {
			t.Errorf("exec %q: %+v %v (stderr %q); want exit 127 with a reason", args, st, err, errb.String())
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("exec %q took %s; a missing program is known at once", args, took)
		}
	}
	st, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "no-such-program"}, nil, nil, nil)
	if err != nil || st.Code != 127 {
		t.Errorf("exec of a shell line naming a missing program: %+v %v", st, err)
	}

	// What no execve can take: 400s, for exec, background processes and
	// a new sandbox's env.
	for _, env := range [][]string{{"NOEQUALS"}, {"=value"}, {"A=b\x00c"}} {
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}, Env: env}, nil, nil, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("exec with env %q: %v, want a 400", env, err)
		}
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}, Env: env}, strings.NewReader(""), nil, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("streamed exec with env %q: %v, want a 400", env, err)
		}
		if _, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"true"}, Env: env}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("process with env %q: %v, want a 400", env, err)
		}
		if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Env: env}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("sandbox with env %q: %v, want a 400", env, err)
		}
	}
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}, Env: []string{"A=", "B=x=y"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Errorf("exec with an empty value and an = in a value: %+v %v", st, err)
	}
	for _, req := range []api.ExecRequest{{Args: []string{"echo", "a\x00b"}}, {Cmd: "echo a\x00b"}, {Args: []string{"true"}, Cwd: "/tmp\x00x"}} {
		if _, err := c.Exec(ctx, sb.ID, req, nil, nil, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("exec %+v: %v, want a 400", req, err)
		}
	}
	// An error inside the exec stream (after its 200) carries its kind's status.
	_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}, Cwd: "/no/such/dir"}, nil, nil, nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 {
		t.Errorf("exec in a missing cwd: %#v, want an error of status 400", err)
	}
	if code, body := rawCall(t, ctx, "POST", base+"/v1/sandboxes/"+sb.ID+"/exec?arg=echo&arg=a%00b", "Bearer", "application/octet-stream", nil); code != 400 {
		t.Errorf("streamed exec with a NUL in an arg: %d %s", code, body)
	}
}

// TestBackgroundStdin: a process started with stdin open reads what
// POST …/stdin sends, and ends at its close; its output is read from an
// offset; the listing holds the tenant's processes, none of Amber's own.
func TestBackgroundStdin(t *testing.T) {
	c, _, _ := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Cmd: `while read l; do echo "got:$l"; done; echo done`, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Processes(ctx, sb.ID)
	if err != nil || !hasPID(ps, pid) {
		t.Fatalf("processes: %+v %v", ps, err)
	}
	for _, p := range ps {
		if p.PID == 1 || strings.Contains(strings.Join(p.Args, " "), "amber") {
			t.Errorf("the listing shows Amber's own process %+v", p)
		}
	}
	if err := c.WriteStdin(ctx, sb.ID, pid, strings.NewReader("a\n"), false); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, sb.ID, pid, strings.NewReader("b\n"), true); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	var exit *api.ExitStatus
	var last int64
	if err := c.ProcessOutput(ctx, sb.ID, pid, 0, true, func(f api.OutputFrame) error {
		got.Write(f.Data)
		if f.Stream == "stdout" {
			last = f.Offset
		}
		if f.Exit != nil {
			exit = f.Exit
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got.String() != "got:a\ngot:b\ndone\n" || exit == nil || exit.Code != 0 {
		t.Fatalf("output %q, exit %+v", got.String(), exit)
	}
	// Re-attached from an offset: the rest only.
	want := got.String()[last:]
	got.Reset()
	if err := c.ProcessOutput(ctx, sb.ID, pid, last, false, func(f api.OutputFrame) error { got.Write(f.Data); return nil }); err != nil || got.String() != want {
		t.Errorf("output from offset %d: %q %v, want %q", last, got.String(), err, want)
	}
	// A process started without stdin takes none; an unknown pid is a 404.
	quiet, err := c.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, sb.ID, quiet, strings.NewReader("x"), false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("stdin to a process started without it: %v, want a 400", err)
	}
	if err := c.WriteStdin(ctx, sb.ID, 99999, strings.NewReader("x"), false); !errdefs.IsNotFound(err) {
		t.Errorf("stdin to no process: %v, want a 404", err)
	}
}

func TestEverydayFiles(t *testing.T) {
	c, _, base := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	files := base + "/v1/sandboxes/" + sb.ID + "/files"
	for _, p := range []string{"tmp/x", "x", ".", "../etc/passwd", "/tmp/a%00b"} {
		for _, call := range []struct{ method, url string }{
			{"GET", files + "?path=" + p}, {"GET", files + "?stat=true&path=" + p}, {"PUT", files + "?path=" + p},
			{"DELETE", files + "?path=" + p}, {"POST", files + "/mkdir?path=" + p}, {"GET", files + "/tar?path=" + p},
			{"PUT", files + "/tar?path=" + p}, {"GET", files + "/watch?path=" + p},
		} {
			if code, body := rawCall(t, ctx, call.method, call.url, "Bearer", "", strings.NewReader("")); code != 400 {
				t.Errorf("%s %s: %d %s, want a 400 (not an absolute path)", call.method, call.url, code, body)
			}
		}
	}
	if err := c.Rename(ctx, sb.ID, "tmp/a", "/tmp/b"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("rename from a relative path: %v", err)
	}
	// Writes into /proc: a 400 that names /proc, not a runtime's errno.
	for what, err := range map[string]error{
		"write":  c.WriteFile(ctx, sb.ID, "/proc/sys/kernel/hostname", strings.NewReader("x"), 0o644),
		"mkdir":  c.Mkdir(ctx, sb.ID, "/proc/newdir", 0o755),
		"remove": c.Remove(ctx, sb.ID, "/proc/self", false),
		"rename": c.Rename(ctx, sb.ID, "/tmp", "/proc/tmp"),
	} {
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/proc is the kernel's view") {
			t.Errorf("%s into /proc: %v, want a 400 saying why", what, err)
		}
	}
}

func TestEverydayHTTP(t *testing.T) {
	c, _, base := newAPILimits(t, engine.Options{}, server.Limits{BodyReadTimeout: 500 * time.Millisecond})
	ctx := ctxT(t)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		if code, body := rawCall(t, ctx, "GET", base+"/v1/info", scheme, "", nil); code != 200 {
			t.Errorf("Authorization: %s <key>: %d %s", scheme, code, body)
		}
	}
	if code, _ := rawCall(t, ctx, "GET", base+"/v1/info", "Basic", "", nil); code != 401 {
		t.Errorf("Authorization: Basic <key>: %d, want 401", code)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(base, "http://")
	// A client that stops sending mid-body: answered (a 400 naming the
	// limit) and its connection closed, within the timeout and a margin.
	for _, call := range []struct{ head, part string }{
		{"POST /v1/sandboxes HTTP/1.1\r\nContent-Type: application/json\r\n", `{"template":"mini`},
		{"PUT /v1/sandboxes/" + sb.ID + "/files?path=/tmp/stalled HTTP/1.1\r\n", "the first bytes of many"},
		{"POST /v1/sandboxes/" + sb.ID + "/exec HTTP/1.1\r\nContent-Type: application/json\r\n", `{"args":["ec`},
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = io.WriteString(conn, call.head+"Host: "+host+"\r\nAuthorization: Bearer "+testKey+"\r\nContent-Length: 100000\r\n\r\n"+call.part)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: no answer to a stalled body: %v", call.head, err)
		}
		var e api.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(e.Error.Message, "body_read_timeout") {
			t.Errorf("%q: stalled body answered %d %+v, want a 400 naming body_read_timeout", call.head, resp.StatusCode, e)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("%q: the connection of a stalled body stays open (%v)", call.head, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%q: a stalled body held the connection for %s", call.head, took)
		}
		conn.Close()
	}
	// A slow but steady upload is not cut: a byte every 200 ms (under the
	// timeout) for 1.2 s.
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 6; i++ {
			time.Sleep(200 * time.Millisecond)
			pw.Write([]byte{'a' + byte(i)})
		}
		pw.Close()
	}()
	if err := c.WriteFile(ctx, sb.ID, "/tmp/slow", pr, 0o644); err != nil {
		t.Fatalf("slow upload: %v", err)
	}
	var buf bytes.Buffer
	if err := c.ReadFile(ctx, sb.ID, "/tmp/slow", &buf); err != nil || buf.String() != "abcdef" {
		t.Fatalf("slow upload reads back %q %v", buf.String(), err)
	}
	// A streamed exec's stdin may idle (an interactive shell): not timed.
	pr, pw = io.Pipe()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		io.WriteString(pw, "late\n")
		pw.Close()
	}()
	buf.Reset()
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"cat"}}, pr, &buf, nil); err != nil || st.Code != 0 || buf.String() != "late\n" {
		t.Fatalf("exec with idle streamed stdin: %+v %v %q", st, err, buf.String())
	}
	// A long call after a body that ended is not cut by a stale deadline.
	buf.Reset()
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "sleep 1.5; echo slept"}, nil, &buf, nil); err != nil || st.Code != 0 || buf.String() != "slept\n" {
		t.Fatalf("exec that outlives the body timeout: %+v %v %q", st, err, buf.String())
	}
}

// TestExecWakesIdle: exec (JSON and streamed) and a terminal's ticket on
// a sandbox stopped for being idle resume it, as files and MCP do, instead
// of answering 412.
func TestExecWakesIdle(t *testing.T) {
	c, env, base := newAPIWith(t, engine.Options{Recovery: engine.RecoveryOptions{IdleTimeout: 2 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo kept > /root/note"}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("exec: %+v %v", st, err)
	}
	waitIdle := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			cur, err := env.Meta.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if cur.State == meta.StateStopped && strings.HasPrefix(cur.Reason, "idle") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not stopped idle after a minute: %+v", cur)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitIdle()
	var out bytes.Buffer
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"cat", "/root/note"}}, nil, &out, nil); err != nil || st.Code != 0 || out.String() != "kept\n" {
		t.Fatalf("exec on an idle sandbox: %+v %v %q; want it resumed", st, err, out.String())
	}
	waitIdle()
	out.Reset()
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"cat"}}, strings.NewReader("streamed"), &out, nil); err != nil || st.Code != 0 || out.String() != "streamed" {
		t.Fatalf("streamed exec on an idle sandbox: %+v %v %q", st, err, out.String())
	}
	waitIdle()
	if code, body := rawCall(t, ctx, "POST", base+"/v1/sandboxes/"+sb.ID+"/terminal", "Bearer", "", nil); code != 201 {
		t.Fatalf("terminal ticket of an idle sandbox: %d %s; want it resumed", code, body)
	}
	if cur, _ := env.Meta.Get(ctx, sb.ID); cur.State != meta.StateRunning {
		t.Fatalf("after the ticket the sandbox is %s", cur.State)
	}
	// A sandbox stopped otherwise (killed) is still a 412.
	if _, err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}}, nil, nil, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec on a killed sandbox: %v, want a 412", err)
	}
}
