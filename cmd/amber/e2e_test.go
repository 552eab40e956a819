package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

// The end-to-end tests build amber, run `amber up` as a subprocess on a free
// loopback port with a fresh data directory, and drive it with the CLI, as a
// user would. The driver is enginetest.DriverName() (gvisor by default).

func TestMain(m *testing.M) {
	enginetest.RunInitHooks()
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// amberBin is the binary under test; builtBin is set when the tests built it.
var amberBin, builtBin string

// buildAmber builds the binary once per test run (or uses $AMBER_BIN).
func buildAmber(t *testing.T) string {
	t.Helper()
	if amberBin != "" {
		return amberBin
	}
	if b := os.Getenv("AMBER_BIN"); b != "" {
		amberBin = b
		return b
	}
	// A directory of its own: amber-agent goes next to amber, where the
	// daemon looks for it (as `make build` puts both in bin/).
	dir, err := os.MkdirTemp("", fmt.Sprintf("amber-e2e-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "amber")
	args := []string{"build", "-o", out}
	if buildTags != "" {
		args = append(args, "-tags", buildTags)
	}
	cmd := exec.Command("go", append(args, ".")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	cmd = exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "amber-agent"), "../amber-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build amber-agent: %v\n%s", err, b)
	}
	amberBin, builtBin = out, out
	return out
}

type daemon struct {
	t       *testing.T
	bin     string
	dataDir string
	addr    string
	cmd     *exec.Cmd
	pid     int           // the daemon this test started; never <= 0
	exited  chan struct{} // closed when it has exited (and was reaped)
	logPath string
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startDaemon runs `amber up` and waits until it answers.
func startDaemon(t *testing.T, bin, dataDir, addr string, extra ...string) *daemon {
	t.Helper()
	return startDaemonEnv(t, bin, dataDir, addr, nil, extra...)
}

// startDaemonEnv is startDaemon with env added to the daemon's environment.
func startDaemonEnv(t *testing.T, bin, dataDir, addr string, env []string, extra ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, bin: bin, dataDir: dataDir, addr: addr, logPath: filepath.Join(dataDir, fmt.Sprintf("up-%d.log", time.Now().UnixNano()))}
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"up", "--data-dir", dataDir, "--addr", addr, "--driver", enginetest.DriverName()}, extra...)
	d.cmd = exec.Command(bin, args...)
	if env != nil {
		d.cmd.Env = append(os.Environ(), env...)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.pid, d.exited = d.cmd.Process.Pid, make(chan struct{})
	if d.pid <= 0 {
		t.Fatalf("amber up started with pid %d", d.pid)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("amber up exited: %v\n%s", d.cmd.ProcessState, d.log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("amber up did not answer within 90s\n%s", d.log())
		}
	}
	t.Cleanup(func() { d.stop(syscall.SIGKILL) })
	return d
}

func (d *daemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// stop sends sig to the one daemon this test started (by its PID, through
// os.Process, which refuses once the process is reaped) and waits up to 60s
// for it to exit.
func (d *daemon) stop(sig syscall.Signal) {
	select {
	case <-d.exited:
		return
	default:
	}
	if d.pid <= 0 || d.cmd.Process.Signal(sig) != nil {
		return
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		d.t.Errorf("amber up (pid %d) did not exit within 60s of %v", d.pid, sig)
	}
}

// amber runs the CLI against the daemon and returns stdout, stderr and the
// exit code.
func (d *daemon) amber(args ...string) (string, string, int) {
	d.t.Helper()
	return d.amberIn("", args...)
}

func (d *daemon) amberIn(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bin, append([]string{"--data-dir", d.dataDir, "--addr", d.addr}, args...)...)
	cmd.Env = append(os.Environ(), "AMBER_TOKEN=", "AMBER_ADDR=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("amber %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// must runs the CLI and fails the test unless it exits 0.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	out, errs, code := d.amber(args...)
	if code != 0 {
		d.t.Fatalf("amber %s: exit %d\nstdout: %s\nstderr: %s\ndaemon log:\n%s", strings.Join(args, " "), code, out, errs, tail(d.log(), 30))
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func e2eSetup(t *testing.T) (string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	enginetest.Catalog(t) // skips (or fails under CI) without templates
	dir, err := os.MkdirTemp("", "amber-e2e-data-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	// Registered before any daemon starts, so it runs after each daemon was
	// stopped (cleanups run last-in first-out): a daemon stopped by SIGKILL
	// leaves its sandboxes (the warm pool's too) running, and removing the
	// data dir alone would orphan them.
	t.Cleanup(func() {
		destroyLeftovers(t, filepath.Join(dir, "drivers", enginetest.DriverName()))
		enginetest.RemoveAll(dir)
	})
	enginetest.NewDriver(t, filepath.Join(dir, "check")) // skips (or fails under CI) without a runtime
	return buildAmber(t), dir
}

// minioBlobs starts a MinIO on loopback for the test, puts its keys in
// the environment `amber up` reads them from, and returns the flags that
// make a daemon keep its checkpoints there under prefix.
func minioBlobs(t *testing.T, prefix string) []string {
	t.Helper()
	srv := miniotest.Start(t)
	cfg := srv.Config()
	t.Setenv("AMBER_S3_ACCESS_KEY", cfg.AccessKey)
	t.Setenv("AMBER_S3_SECRET_KEY", cfg.SecretKey)
	return []string{"--blobs", "s3://" + cfg.Endpoint + "/" + cfg.Bucket + "/" + prefix + "?secure=false&create=true"}
}

// destroyLeftovers destroys every sandbox a driver has state for under
// stateDir.
func destroyLeftovers(t *testing.T, stateDir string) {
	if _, err := os.Stat(stateDir); err != nil {
		return
	}
	drv := enginetest.NewDriver(t, stateDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	infos, err := drv.List(ctx)
	if err != nil {
		t.Errorf("list leftover sandboxes: %v", err)
		return
	}
	for _, in := range infos {
		if err := drv.Destroy(ctx, in.ID); err != nil {
			t.Errorf("destroy leftover sandbox %s: %v", in.ID, err)
		}
	}
}

func hasTemplate(name string) bool {
	m, _ := filepath.Glob(filepath.Join(enginetest.Cache(), "templates", name+"-*", "rootfs"))
	return len(m) > 0
}

func TestE2ECreateExecFilesRm(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "minimal=1")
	if fi, err := os.Stat(filepath.Join(dir, "admin.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key: %v %v", fi, err)
	}

	tmpl, cmd, want := "minimal", []string{"echo", "42"}, "42\n"
	if hasTemplate("python") {
		tmpl, cmd = "python", []string{"python3", "-c", "print(6*7)"}
	}
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", tmpl, "--memory", "256Mi", "--cpus", "1"))
	if got := d.must(append([]string{"exec", id, "--"}, cmd...)...); got != want {
		t.Fatalf("exec %v printed %q", cmd, got)
	}
	if _, _, code := d.amber("exec", id, "--", "sh", "-c", "exit 5"); code != 5 {
		t.Fatalf("exit code propagation: got %d", code)
	}
	out, errs, code := d.amber("exec", id, "--", "sh", "-c", "echo to-out; echo to-err >&2")
	if code != 0 || out != "to-out\n" || errs != "to-err\n" {
		t.Fatalf("streams: %d %q %q", code, out, errs)
	}
	if out, _, _ := d.amberIn("piped\n", "exec", "-i", id, "--", "cat"); out != "piped\n" {
		t.Fatalf("exec -i: %q", out)
	}
	var res struct {
		Exit   struct{ Code int }
		Stdout string
	}
	out, _, _ = d.amber("exec", "--json", id, "--", "sh", "-c", "echo j; exit 2")
	if json.Unmarshal([]byte(out), &res) != nil || res.Exit.Code != 2 || res.Stdout != "j\n" {
		t.Fatalf("exec --json: %q", out)
	}

	local := filepath.Join(t.TempDir(), "note.txt")
	os.WriteFile(local, []byte("from the host\n"), 0o644)
	d.must("files", "put", id, local, "/root/note.txt")
	if got := d.must("files", "cat", id, "/root/note.txt"); got != "from the host\n" {
		t.Fatalf("files cat: %q", got)
	}
	if got := d.must("files", "ls", id, "/root"); !strings.Contains(got, "note.txt") {
		t.Fatalf("files ls: %q", got)
	}
	back := filepath.Join(t.TempDir(), "back.txt")
	d.must("files", "get", id, "/root/note.txt", back)
	if b, _ := os.ReadFile(back); string(b) != "from the host\n" {
		t.Fatalf("files get: %q", b)
	}
	d.must("files", "mv", id, "/root/note.txt", "/root/moved.txt")
	if got := d.must("exec", id, "--", "cat", "/root/moved.txt"); got != "from the host\n" {
		t.Fatalf("after files mv: %q", got)
	}
	if got := d.must("ps", id); !strings.Contains(got, "PID") {
		t.Fatalf("ps: %q", got)
	}
	// A background process: amber wait exits with its code, also when
	// asked again after the end.
	pid := strings.TrimSpace(d.must("exec", "-d", id, "--", "sh", "-c", "sleep 1; exit 9"))
	for range 2 {
		if out, errs, code := d.amber("wait", id, pid); code != 9 || out != "exit 9\n" {
			t.Fatalf("wait: %d %q %q", code, out, errs)
		}
	}
	if out, _, code := d.amber("wait", "--json", id, pid); code != 9 || out != `{"code":9}`+"\n" {
		t.Fatalf("wait --json: %d %q", code, out)
	}
	// Killed from inside the sandbox: 128+9, and the signal is named.
	pid = strings.TrimSpace(d.must("exec", "-d", id, "--", "sleep", "300"))
	d.must("exec", id, "--", "sh", "-c", "kill -9 "+pid)
	if out, errs, code := d.amber("wait", id, pid); code != 137 || !strings.Contains(out, "SIGKILL") {
		t.Fatalf("wait for a killed process: %d %q %q", code, out, errs)
	}
	if _, errs, code := d.amber("wait", id, "99999"); code != 1 || !strings.Contains(errs, "not found") {
		t.Fatalf("wait for a pid never started: %d %q", code, errs)
	}
	var sb struct{ ID, State string }
	if json.Unmarshal([]byte(d.must("sandbox", "ls", "--json")), &sb) != nil || sb.ID != id || sb.State != "running" {
		t.Fatalf("ls --json: %+v", sb)
	}

	// Bad input: a clear message and a non-zero exit.
	if _, errs, code := d.amber("sandbox", "create"); code != 2 || !strings.Contains(errs, "--template") {
		t.Fatalf("create without template: %d %q", code, errs)
	}
	if _, errs, code := d.amber("sandbox", "create", "--template", "minimal", "--memory", "lots"); code != 2 || !strings.Contains(errs, "lots") {
		t.Fatalf("bad memory: %d %q", code, errs)
	}
	if _, errs, code := d.amber("exec", "sbx-nosuchsandbox", "--", "true"); code != 1 || !strings.Contains(errs, "not found") {
		t.Fatalf("exec in missing sandbox: %d %q", code, errs)
	}
	if _, errs, code := d.amber("--token", "wrong", "sandbox", "ls"); code != 1 || !strings.Contains(errs, "not valid") {
		t.Fatalf("wrong token: %d %q", code, errs)
	}

	d.must("sandbox", "rm", id)
	if got := d.must("sandbox", "ls", "--json"); got != "" {
		t.Fatalf("ls after rm: %q", got)
	}
	// A clean stop drains the warm pool and exits 0.
	d.stop(syscall.SIGTERM)
	if !d.cmd.ProcessState.Success() {
		t.Fatalf("amber up after SIGTERM: %v", d.cmd.ProcessState)
	}
	if !strings.Contains(d.log(), "warm pool drained at shutdown") {
		t.Fatalf("pool not drained at shutdown:\n%s", tail(d.log(), 20))
	}
}

// TestE2EDaemonRestart: SIGKILL the daemon; a sandbox that still runs is
// listed and execs after the restart; one killed while the daemon was down
// is marked crashed, with an event in the log.
func TestE2EDaemonRestart(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	alive := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	lost := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("files", "put", alive, "-", "/root/kept") // empty file, must survive
	d.stop(syscall.SIGKILL)

	killBehindBack(t, dir, lost)

	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	ls := d.must("sandbox", "ls")
	if !strings.Contains(ls, alive) || !strings.Contains(ls, lost) {
		t.Fatalf("after restart ls:\n%s", ls)
	}
	if got := d.must("exec", alive, "--", "sh", "-c", "ls /root/kept && echo ok"); !strings.HasSuffix(got, "ok\n") {
		t.Fatalf("exec in reattached sandbox: %q", got)
	}
	var sb struct{ State, Reason string }
	json.Unmarshal([]byte(d.must("sandbox", "inspect", "--json", lost)), &sb)
	if sb.State != "crashed" || sb.Reason == "" {
		t.Fatalf("lost sandbox: %+v", sb)
	}
	evs := strings.Split(strings.TrimSpace(d.must("sandbox", "events", "--json", lost)), "\n")
	var last struct{ Type string }
	json.Unmarshal([]byte(evs[len(evs)-1]), &last)
	if last.Type != "sandbox.crashed" {
		t.Fatalf("lost sandbox events: %v", evs)
	}
	d.must("sandbox", "rm", alive, lost)
}

// killBehindBack kills sandbox id of data dir dir with the driver itself,
// from its on-disk state, while no daemon runs.
func killBehindBack(t *testing.T, dir, id string) {
	t.Helper()
	drv := enginetest.NewDriver(t, filepath.Join(dir, "drivers", enginetest.DriverName()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := drv.Kill(ctx, id); err != nil {
		t.Fatalf("kill %s behind the daemon's back: %v", id, err)
	}
}
