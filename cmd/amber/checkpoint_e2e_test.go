package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/stores/s3"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

// TestE2ECheckpointRecover goes through the CLI: a sandbox with a web
// server behind an exposed port and an in-memory counter is checkpointed,
// changed, killed; a new daemon process recovers it: the counter continues
// with its random value, the change after the cut is gone, and the exposed
// URL serves again. Then a fork while the original runs, and bad input.
func TestE2ECheckpointRecover(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	// Long-running processes are started with exec -d: under gvisor a
	// process left behind by a plain exec (runsc exec) is not restored.
	d.must("exec", id, "--", "sh", "-c", "mkdir -p /www && echo ckpt-e2e > /www/index.html")
	d.must("exec", "-d", id, "--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www")
	pid := strings.TrimSpace(d.must("exec", "-d", id, "--", "sh", "-c", `R=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); i=0; while :; do i=$((i+1)); echo "$R $i"; sleep 0.05; done`))
	u := strings.TrimSpace(d.must("port", "expose", id, "8080"))
	get := func() (int, string) {
		resp, err := portClient(d.addr).Get(u) // the port's origin, at the daemon
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitPage := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, body := get()
			if code == 200 && body == "ckpt-e2e\n" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: GET %s = %d %q\n%s", what, u, code, body, tail(d.log(), 20))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitPage("before the checkpoint")
	counter := func(sb string) (string, string) {
		t.Helper()
		f := strings.Fields(d.must("exec", sb, "--", "sh", "-c", "tail -n 2 /run/amber/proc/"+pid+".log | head -n 1"))
		if len(f) != 2 {
			t.Fatalf("counter log of %s: %v", sb, f)
		}
		return f[0], f[1]
	}
	time.Sleep(300 * time.Millisecond)

	out, errs, code := d.amber("checkpoint", "--json", id)
	if code != 0 {
		t.Fatalf("checkpoint: exit %d %s %s", code, out, errs)
	}
	var ck struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Seq   uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(out), &ck); err != nil || ck.State != "committed" || !strings.HasPrefix(ck.ID, "ckpt-") {
		t.Fatalf("checkpoint --json: %q %v", out, err)
	}
	if !strings.Contains(errs, "upload") {
		t.Errorf("no progress on stderr: %q", errs)
	}
	r0, _ := counter(id)
	if ls := d.must("checkpoint", "ls", id); !strings.Contains(ls, ck.ID) || !strings.Contains(ls, "committed") {
		t.Fatalf("checkpoint ls: %q", ls)
	}
	d.must("exec", id, "--", "sh", "-c", "echo after > /root/after")
	d.must("sandbox", "kill", id)
	if _, _, code := d.amber("exec", id, "--", "true"); code == 0 {
		t.Fatal("exec in a killed sandbox succeeded")
	}

	// A new daemon process recovers it.
	d.stop(syscall.SIGTERM)
	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	if got := strings.TrimSpace(d.must("sandbox", "recover", id)); got != id {
		t.Fatalf("recover printed %q", got)
	}
	if r, _ := counter(id); r != r0 {
		t.Errorf("counter's random value %s after recover, %s before: restarted, not restored", r, r0)
	}
	if _, _, code := d.amber("exec", id, "--", "test", "-e", "/root/after"); code == 0 {
		t.Error("a file written after the cut survived the recover")
	}
	waitPage("after recover")
	if ev := d.must("sandbox", "events", id); !strings.Contains(ev, "sandbox.restored") || !strings.Contains(ev, "sandbox.checkpointed") {
		t.Errorf("events: %s", ev)
	}

	// A fork while the original runs, on both drivers.
	fork := strings.TrimSpace(d.must("restore", "--as-new", ck.ID))
	if fork == id || !strings.HasPrefix(fork, "sbx-") {
		t.Fatalf("restore --as-new printed %q", fork)
	}
	if r, _ := counter(fork); r != r0 {
		t.Errorf("fork's counter value %s, original %s", r, r0)
	}
	d.must("sandbox", "rm", fork)

	if _, errs, code := d.amber("restore", "ckpt-nosuchcheckpoint"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("restore of a missing checkpoint: exit %d %q", code, errs)
	}
	if _, errs, code := d.amber("checkpoint"); code != 2 || !strings.Contains(errs, "sandbox id") {
		t.Errorf("checkpoint without a sandbox: exit %d %q", code, errs)
	}
	if _, errs, code := d.amber("checkpoint", "--tag", "bad tag!", id); code == 0 || !strings.Contains(errs, "tag") {
		t.Errorf("bad tag: exit %d %q", code, errs)
	}
	d.must("checkpoint", "rm", ck.ID)
	if ls := d.must("checkpoint", "ls", id); strings.Contains(ls, ck.ID) {
		t.Errorf("deleted checkpoint still listed: %q", ls)
	}
	d.must("sandbox", "rm", id)
}

// TestE2ECheckpointOnMinIO: `amber up --blobs s3://…` keeps checkpoints in
// a real MinIO server (started on loopback); a recover reads them back.
func TestE2ECheckpointOnMinIO(t *testing.T) {
	bin, dir := e2eSetup(t)
	srv := miniotest.Start(t)
	cfg := srv.Config()
	t.Setenv("AMBER_S3_ACCESS_KEY", cfg.AccessKey)
	t.Setenv("AMBER_S3_SECRET_KEY", cfg.SecretKey)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0",
		"--blobs", "s3://"+cfg.Endpoint+"/"+cfg.Bucket+"/node-a?secure=false&create=true")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "sh", "-c", "echo on-minio > /root/f")
	ck := strings.TrimSpace(d.must("checkpoint", id))
	d.must("exec", id, "--", "rm", "/root/f")
	d.must("sandbox", "kill", id)
	d.must("sandbox", "recover", id)
	if out := d.must("exec", id, "--", "cat", "/root/f"); out != "on-minio\n" {
		t.Fatalf("file after recover from MinIO: %q", out)
	}
	// The objects are in the bucket, under the prefix, and none on disk.
	cfg.CreateBucket = false
	st, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for info, err := range st.List(context.Background(), "node-a/tenants/default/checkpoints/"+ck+"/") {
		if err != nil {
			t.Fatal(err)
		}
		_ = info
		n++
	}
	if n < 2 {
		t.Errorf("%d objects of %s in MinIO, want the manifest and the pointer", n, ck)
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs")); !os.IsNotExist(err) {
		t.Errorf("a local blob store exists beside the S3 one: %v", err)
	}
	if _, errs, code := d.amber("sandbox", "rm", id); code != 0 {
		t.Fatal(errs)
	}
}
