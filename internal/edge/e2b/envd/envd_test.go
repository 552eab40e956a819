package envd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/amber-run/amber/internal/edge/e2b/envd"
	fspb "github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem/filesystemconnect"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/process"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/process/processconnect"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

func TestMain(m *testing.M) { enginetest.Main(m) }

const (
	keyA = "amber_envd_test_key_tenant_a_0123456789"
	keyB = "amber_envd_test_key_tenant_b_0123456789"
)

// fixture is a real engine with one sandbox of tenant "default" (key
// keyA) and a second tenant "globex" (key keyB) with none, behind envd's
// handler.
type fixture struct {
	url string
	id  string
	env *enginetest.Env
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOf(t, "minimal")
}

// newFixtureOf is newFixture with a sandbox of the named template (the
// test skips when it is not installed).
func newFixtureOf(t testing.TB, template string) *fixture {
	t.Helper()
	env := enginetest.New(t, engine.Options{})
	if _, err := env.Catalog.Get(template); err != nil {
		t.Skipf("template %s is not installed (make setup-%s)", template, template)
	}
	ctx := ctxT(t)
	if _, err := env.Meta.CreateTenant(ctx, meta.Tenant{ID: "globex"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []meta.APIKey{
		{Tenant: "default", Name: "a", Hash: meta.HashKey(keyA), Scopes: meta.AllScopes},
		{Tenant: "globex", Name: "b", Hash: meta.HashKey(keyB), Scopes: meta.AllScopes},
	} {
		if err := env.Meta.PutKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: template})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(envd.Handler(envd.Options{Engine: env.Engine, Auth: envd.KeyAuthorizer(env.Meta, nil), Logger: enginetest.Logger(t)}))
	t.Cleanup(ts.Close)
	return &fixture{url: ts.URL, id: sb.ID, env: env}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sdkHeaders adds what the e2b SDK sends with every envd request: the
// sandbox's id and port (E2B_SANDBOX_URL routing) and its access token.
type sdkHeaders struct {
	id, token string
}

func (h sdkHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (f *fixture) httpClient(token string) *http.Client {
	return &http.Client{Transport: sdkHeaders{id: f.id, token: token}}
}

// The SDK speaks the connect protocol with JSON (useBinaryFormat: false).
func (f *fixture) proc(token string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(f.httpClient(token), f.url, connect.WithProtoJSON())
}

func (f *fixture) files(token string) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(f.httpClient(token), f.url, connect.WithProtoJSON())
}

func code(err error) connect.Code { return connect.CodeOf(err) }

// collected is a process stream read to its end.
type collected struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads events from a Start or Connect stream until the end event
// (or until stop says enough).
func collect(t *testing.T, s eventStream, ev func() *pb.ProcessEvent, stop func(collected) bool) collected {
	t.Helper()
	var c collected
	for s.Receive() {
		switch e := ev().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			c.pid = e.Start.GetPid()
		case *pb.ProcessEvent_Data:
			c.stdout += string(e.Data.GetStdout())
			c.stderr += string(e.Data.GetStderr())
		case *pb.ProcessEvent_End:
			c.end = e.End
			return c
		}
		if stop != nil && stop(c) {
			return c
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v (so far %+v)", err, c)
	}
	return c
}

func startCollect(t *testing.T, s *connect.ServerStreamForClient[pb.StartResponse], stop func(collected) bool) collected {
	t.Helper()
	return collect(t, s, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, stop)
}

func connectCollect(t *testing.T, s *connect.ServerStreamForClient[pb.ConnectResponse], stop func(collected) bool) collected {
	t.Helper()
	return collect(t, s, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, stop)
}

func cwd(s string) *string { return &s }

// TestEnvdProcess: a command streams stdout, stderr and its exit code
// with its envs and cwd; a background command with stdin is listed with
// its tag (and nothing of Amber's own), takes input, is re-attached by
// tag with its whole output, and a SIGKILL ends it; bad selectors get
// the codes the SDK expects.
func TestEnvdProcess(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	pc := f.proc(keyA)

	t.Run("start", func(t *testing.T) {
		s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
			Cmd: "/bin/sh", Args: []string{"-c", `echo "$FOO"; pwd; echo oops >&2; exit 3`},
			Envs: map[string]string{"FOO": "bar baz"}, Cwd: cwd("/tmp"),
		}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c := startCollect(t, s, nil)
		if c.pid == 0 || c.stdout != "bar baz\n/tmp\n" || c.stderr != "oops\n" || c.end == nil || c.end.ExitCode != 3 || !c.end.Exited || c.end.Status != "exit status 3" || c.end.GetError() != "exit status 3" {
			t.Fatalf("got %+v end %+v", c, c.end)
		}
	})

	t.Run("big output", func(t *testing.T) {
		// 16 times the sandbox's output ring, faster than the stream
		// reads it: every byte arrives (the command waits for the
		// stream), as from envd.
		const n = 16 << 20
		s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
			Cmd: "/bin/sh", Args: []string{"-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", n)}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got, other := 0, 0
		var end *pb.ProcessEvent_EndEvent
		for s.Receive() {
			for _, b := range s.Msg().GetEvent().GetData().GetStdout() {
				if b == 'a' {
					got++
				} else {
					other++
				}
			}
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if got != n || other != 0 || end == nil || end.ExitCode != 0 {
			t.Fatalf("%d of %d bytes (%d others), end %+v, stream %v", got, n, other, end, s.Err())
		}
	})

	t.Run("background", func(t *testing.T) {
		tag := "echo-server"
		sctx, cancel := context.WithCancel(ctx)
		stdin := true
		s, err := pc.Start(sctx, connect.NewRequest(&pb.StartRequest{Tag: &tag, Stdin: &stdin, Process: &pb.ProcessConfig{
			Cmd: "/bin/sh", Args: []string{"-c", `echo ready; while read l; do echo "got $l"; done`},
		}}))
		if err != nil {
			t.Fatal(err)
		}
		c := startCollect(t, s, func(c collected) bool { return c.stdout == "ready\n" })
		if c.pid == 0 || c.stdout != "ready\n" || c.end != nil {
			t.Fatalf("start: %+v", c)
		}
		cancel() // the SDK's disconnect: the command runs on
		s.Close()

		l, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range l.Msg.Processes {
			if p.Pid == 1 {
				t.Errorf("the list shows pid 1 (the sandbox's agent): %+v", p)
			}
			if p.Pid == c.pid {
				found = p.GetTag() == tag && p.GetConfig().GetCmd() == "/bin/sh"
			}
		}
		if !found {
			t.Fatalf("pid %d (tag %s) not listed as started: %+v", c.pid, tag, l.Msg.Processes)
		}

		// A tag names one live command.
		dup, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Tag: &tag, Process: &pb.ProcessConfig{Cmd: "/bin/true"}}))
		if err == nil {
			dup.Receive()
			err = dup.Err()
			dup.Close()
		}
		if code(err) != connect.CodeAlreadyExists {
			t.Errorf("a second command tagged %s: %v", tag, err)
		}
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
		if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
			Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("ping\n")}}})); err != nil {
			t.Fatal(err)
		}
		cs, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		rc := connectCollect(t, cs, func(c collected) bool { return strings.Contains(c.stdout, "got ping\n") })
		if rc.pid != c.pid || rc.stdout != "ready\ngot ping\n" {
			t.Fatalf("connect: %+v", rc)
		}
		if _, err := pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
			Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: c.pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		rc = connectCollect(t, cs, nil)
		if rc.end == nil || rc.end.Exited || rc.end.Status != "signal: killed" {
			t.Fatalf("after SIGKILL: %+v end %+v", rc, rc.end)
		}
		// Its end freed the tag: it names nothing, and a new command may
		// take it.
		if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
			Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}})); code(err) != connect.CodeNotFound {
			t.Errorf("input by the tag of an ended command: %v", err)
		}
		again, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Tag: &tag, Process: &pb.ProcessConfig{Cmd: "/bin/true"}}))
		if err != nil {
			t.Fatal(err)
		}
		if c := startCollect(t, again, nil); c.end == nil || c.end.ExitCode != 0 {
			t.Errorf("a new command with the freed tag: %+v", c)
		}
		again.Close()
	})

	t.Run("stream input, close stdin", func(t *testing.T) {
		stdin := true
		s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Stdin: &stdin, Process: &pb.ProcessConfig{Cmd: "/bin/cat"}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
			t.Fatalf("no start event: %v", s.Err())
		}
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
		in := pc.StreamInput(ctx)
		for _, m := range []*pb.StreamInputRequest{
			{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
			{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("one\n")}}}}},
			{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
			{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("two\n")}}}}},
		} {
			if err := in.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := in.CloseAndReceive(); err != nil {
			t.Fatal(err)
		}
		if _, err := pc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		c := startCollect(t, s, nil)
		if c.stdout != "one\ntwo\n" || c.end == nil || c.end.ExitCode != 0 {
			t.Fatalf("cat fed by StreamInput, then end of file: %+v end %+v", c, c.end)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		// The SDK's timeoutMs travels as Connect-Timeout-Ms: the stream
		// ends DeadlineExceeded and the command is killed then, as envd
		// does, though nobody follows it any more.
		tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		s, err := pc.Start(tctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"60"}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var pid uint32
		var end *pb.ProcessEvent_EndEvent
		for s.Receive() {
			if st := s.Msg().GetEvent().GetStart(); st != nil {
				pid = st.Pid
			}
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		// The kill and the deadline come at once: the stream ends with
		// whichever is first, the deadline or the killed command's end.
		killed := end != nil && !end.Exited && end.Status == "signal: killed"
		if pid == 0 || (code(s.Err()) != connect.CodeDeadlineExceeded && !killed) {
			t.Fatalf("pid %d, end %+v, stream end %v", pid, end, s.Err())
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		st, err := f.env.Engine.Wait(wctx, "default", f.id, int(pid))
		if err != nil || st.Signal != "SIGKILL" {
			t.Fatalf("the timed-out command: %+v %v", st, err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		unknown := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 987654}}
		cs, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: unknown}))
		if err == nil {
			cs.Receive()
			err = cs.Err()
			cs.Close()
		}
		if code(err) != connect.CodeNotFound {
			t.Errorf("connect to an unknown pid: %v", err)
		}
		_, err = pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: unknown, Signal: pb.Signal_SIGNAL_SIGTERM}))
		if code(err) != connect.CodeNotFound {
			t.Errorf("signal to an unknown pid: %v", err)
		}
		_, err = pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{
			Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "nope"}},
			Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
		if code(err) != connect.CodeNotFound {
			t.Errorf("input to an unknown tag: %v", err)
		}
		for name, req := range map[string]*pb.StartRequest{
			"relative cwd": {Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: cwd("tmp")}},
			"no command":   {Process: &pb.ProcessConfig{}},
			"bad env":      {Process: &pb.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A=B": "c"}}},
		} {
			s, err := pc.Start(ctx, connect.NewRequest(req))
			if err == nil {
				s.Receive()
				err = s.Err()
				s.Close()
			}
			if code(err) != connect.CodeInvalidArgument {
				t.Errorf("%s: %v", name, err)
			}
		}
		_, err = pc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: unknown, Pty: &pb.PTY{}}))
		if code(err) != connect.CodeNotFound && code(err) != connect.CodeUnimplemented {
			t.Errorf("update: %v", err)
		}
	})
}

func upload(t *testing.T, f *fixture, token, path string, content []byte) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", path)
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(content)
	mw.Close()
	req, _ := http.NewRequest("POST", f.url+"/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := f.httpClient(token).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func download(t *testing.T, f *fixture, token, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", f.url+"/files?username=user&path="+path, nil)
	resp, err := f.httpClient(token).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEnvdFiles: /files writes (multipart with the path as filename, as
// the SDK's files.write([...]) sends, and octet-stream) and reads; the
// filesystem service stats, makes directories, lists to a depth, moves
// and removes; relative paths are InvalidArgument; WatchDir sees a write.
func TestEnvdFiles(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	fc := f.files(keyA)

	if code, body := upload(t, f, keyA, "/tmp/e2b/sub/a.txt", []byte("hello")); code != 200 || !strings.Contains(body, `"path":"/tmp/e2b/sub/a.txt"`) {
		t.Fatalf("upload: %d %s", code, body)
	}
	req, _ := http.NewRequest("POST", f.url+"/files?path=/tmp/e2b/b.bin", strings.NewReader("raw bytes"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err := f.httpClient(keyA).Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("octet-stream upload: %v %v", resp, err)
	}
	if code, body := download(t, f, keyA, "/tmp/e2b/sub/a.txt"); code != 200 || body != "hello" {
		t.Fatalf("download: %d %q", code, body)
	}
	if code, body := download(t, f, keyA, "/tmp/e2b/b.bin"); code != 200 || body != "raw bytes" {
		t.Fatalf("download: %d %q", code, body)
	}
	if code, _ := download(t, f, keyA, "/tmp/e2b/missing"); code != 404 {
		t.Errorf("download of a missing file: %d", code)
	}
	if code, _ := download(t, f, keyA, "tmp/e2b/b.bin"); code != 400 {
		t.Errorf("download of a relative path: %d", code)
	}

	st, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp/e2b/sub/a.txt"}))
	if err != nil || st.Msg.Entry.Type != fspb.FileType_FILE_TYPE_FILE || st.Msg.Entry.Size != 5 || st.Msg.Entry.Name != "a.txt" || st.Msg.Entry.Path != "/tmp/e2b/sub/a.txt" {
		t.Fatalf("stat: %v %v", st, err)
	}
	md, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/tmp/e2b/new/deep"}))
	if err != nil || md.Msg.Entry.Type != fspb.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("mkdir: %v %v", md, err)
	}
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/tmp/e2b/new/deep"})); code(err) != connect.CodeAlreadyExists {
		t.Errorf("mkdir of an existing dir: %v", err)
	}
	ls, err := fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/tmp/e2b", Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range ls.Msg.Entries {
		paths = append(paths, e.Path)
	}
	if got, want := strings.Join(paths, " "), "/tmp/e2b/b.bin /tmp/e2b/new /tmp/e2b/new/deep /tmp/e2b/sub /tmp/e2b/sub/a.txt"; got != want {
		t.Errorf("list depth 2: %s, want %s", got, want)
	}
	ls, err = fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/tmp/e2b"}))
	if err != nil || len(ls.Msg.Entries) != 3 {
		t.Errorf("list depth 1: %v %v", ls, err)
	}
	mv, err := fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "/tmp/e2b/sub/a.txt", Destination: "/tmp/e2b/new/a2.txt"}))
	if err != nil || mv.Msg.Entry.Path != "/tmp/e2b/new/a2.txt" || mv.Msg.Entry.Size != 5 {
		t.Fatalf("move: %v %v", mv, err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp/e2b/sub/a.txt"})); code(err) != connect.CodeNotFound {
		t.Errorf("stat after move: %v", err)
	}
	if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "/tmp/e2b/new"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp/e2b/new/a2.txt"})); code(err) != connect.CodeNotFound {
		t.Errorf("stat after remove: %v", err)
	}
	for name, err := range map[string]error{
		"stat":   second(fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "tmp/e2b"}))),
		"mkdir":  second(fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "rel"}))),
		"move":   second(fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "/tmp/e2b/b.bin", Destination: "b.bin"}))),
		"list":   second(fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "."}))),
		"remove": second(fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "x"}))),
	} {
		if code(err) != connect.CodeInvalidArgument {
			t.Errorf("%s of a relative path: %v", name, err)
		}
	}

	t.Run("upload limit", func(t *testing.T) {
		small := httptest.NewServer(envd.Handler(envd.Options{Engine: f.env.Engine, Auth: envd.KeyAuthorizer(f.env.Meta, nil), MaxUploadBytes: 16}))
		defer small.Close()
		for name, length := range map[string]bool{"declared": true, "streamed": false} {
			var body io.Reader = strings.NewReader(strings.Repeat("x", 100))
			if !length {
				body = io.MultiReader(body) // no length known up front
			}
			req, _ := http.NewRequest("POST", small.URL+"/files?path=/tmp/e2b/big.bin", body)
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := f.httpClient(keyA).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "max_upload_bytes") {
				t.Errorf("%s: a 100-byte upload over a limit of 16: %d %s", name, resp.StatusCode, b)
			}
		}
	})

	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ws, err := fc.WatchDir(wctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/tmp/e2b"}))
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		if !ws.Receive() || ws.Msg().GetStart() == nil {
			t.Fatalf("first watch event is not start: %v %v", ws.Msg(), ws.Err())
		}
		if code, body := upload(t, f, keyA, "/tmp/e2b/watched.txt", []byte("x")); code != 200 {
			t.Fatalf("upload: %d %s", code, body)
		}
		for ws.Receive() {
			if ev := ws.Msg().GetFilesystem(); ev != nil && ev.Name == "watched.txt" &&
				(ev.Type == fspb.EventType_EVENT_TYPE_CREATE || ev.Type == fspb.EventType_EVENT_TYPE_WRITE) {
				return
			}
		}
		t.Fatalf("no event for watched.txt: %v", ws.Err())
	})

	t.Run("watcher", func(t *testing.T) {
		cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/tmp/e2b"}))
		if err != nil {
			t.Fatal(err)
		}
		wid := cw.Msg.WatcherId
		if code, body := upload(t, f, keyA, "/tmp/e2b/polled.txt", []byte("x")); code != 200 {
			t.Fatalf("upload: %d %s", code, body)
		}
		deadline := time.Now().Add(20 * time.Second)
		seen := false
		for !seen && time.Now().Before(deadline) {
			ev, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev.Msg.Events {
				seen = seen || e.Name == "polled.txt"
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !seen {
			t.Fatal("the watcher saw no event for polled.txt")
		}
		// Another tenant cannot read it (nor, here, reach the sandbox).
		if _, err := f.files(keyB).GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid})); code(err) != connect.CodeNotFound {
			t.Errorf("another tenant's GetWatcherEvents: %v", err)
		}
		if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: wid})); err != nil {
			t.Fatal(err)
		}
		if _, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid})); code(err) != connect.CodeNotFound {
			t.Errorf("a removed watcher: %v", err)
		}
	})
}

func second[T any](_ T, err error) error { return err }

// TestEnvdTenancy: another tenant's key, a wrong key and no key are
// refused on every service and route; the sandbox's owner passes.
func TestEnvdTenancy(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		token string
		want  connect.Code
		http  int
	}{
		{keyB, connect.CodeNotFound, 404},
		{"amber_not_a_key", connect.CodeUnauthenticated, 401},
		{"", connect.CodeUnauthenticated, 401},
	} {
		if _, err := f.files(c.token).Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp"})); code(err) != c.want {
			t.Errorf("token %q: Stat: %v, want %v", c.token, err, c.want)
		}
		if _, err := f.proc(c.token).List(ctx, connect.NewRequest(&pb.ListRequest{})); code(err) != c.want {
			t.Errorf("token %q: List: %v, want %v", c.token, err, c.want)
		}
		s, err := f.proc(c.token).Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}))
		if err == nil {
			s.Receive()
			err = s.Err()
			s.Close()
		}
		if code(err) != c.want {
			t.Errorf("token %q: Start: %v, want %v", c.token, err, c.want)
		}
		if got, _ := download(t, f, c.token, "/etc/hostname"); got != c.http {
			t.Errorf("token %q: GET /files: %d, want %d", c.token, got, c.http)
		}
		if got, _ := upload(t, f, c.token, "/tmp/intruder", []byte("x")); got != c.http {
			t.Errorf("token %q: POST /files: %d, want %d", c.token, got, c.http)
		}
	}
	resp, err := f.httpClient(keyA).Get(f.url + "/health")
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("health: %v %v", resp, err)
	}
	if _, err := f.files(keyA).Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp"})); err != nil {
		t.Fatalf("the owner's Stat: %v", err)
	}
	var ce *connect.Error
	_, err = f.files(keyB).Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp"}))
	if !errors.As(err, &ce) || strings.Contains(ce.Message(), "globex") && strings.Contains(ce.Message(), "default") {
		t.Errorf("another tenant's error: %v", err)
	}
}
