package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EUploadPendingSurvivesRestart: a strict exec is acknowledged once
// its checkpoint is durable on the node (the hot copy), its upload behind.
// With the blob store refusing every write the upload stays pending; the
// daemon is SIGKILLed and the sandbox killed behind its back. The next
// `amber up` must keep the hot copy — the only image of an acknowledged
// checkpoint — restore the sandbox from it with the file the exec wrote,
// and finish the upload. Before the fix, `amber up` emptied its whole work
// directory, hot tier included: the checkpoint was failed as "lost before
// its upload" and the acknowledged write was gone.
func TestE2EUploadPendingSurvivesRestart(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemonEnv(t, bin, dir, addr, []string{"AMBER_TEST_FAILPOINTS=blob.write=1:error/10m"}, "--pool", "0")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal", "--recovery", "strict"))
	d.must("exec", id, "--", "sh", "-c", "echo acknowledged > /root/kept")

	type ckpt struct {
		ID             string `json:"id"`
		State          string `json:"state"`
		ManifestDigest string `json:"manifest_digest"`
	}
	newest := func() ckpt {
		t.Helper()
		var cks []ckpt
		out := d.must("checkpoint", "ls", "--json", id)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var c ckpt
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				t.Fatalf("checkpoint ls --json: %q %v", out, err)
			}
			cks = append(cks, c)
		}
		c := cks[0]
		for _, x := range cks {
			if x.State == "committed" {
				c = x // listed oldest first: the last committed is the newest
			}
		}
		return c
	}
	ck := newest()
	if ck.State != "committed" || ck.ManifestDigest != "" {
		t.Fatalf("the strict exec's checkpoint %+v: want committed on the node with its upload pending (no manifest)", ck)
	}
	d.stop(syscall.SIGKILL)

	killBehindBack(t, dir, id)

	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	if _, errs, code := d.amber("sandbox", "recover", id); code != 0 {
		t.Fatalf("recover after the restart: exit %d %s\n%s", code, errs, tail(d.log(), 30))
	}
	if got := strings.TrimSpace(d.must("exec", id, "--", "cat", "/root/kept")); got != "acknowledged" {
		t.Fatalf("after the restart the acknowledged write reads %q", got)
	}
	if strings.Contains(d.log(), "lost before its upload") {
		t.Fatalf("the restarted daemon lost the hot copy:\n%s", tail(d.log(), 30))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var c ckpt
		if err := json.Unmarshal([]byte(d.must("checkpoint", "inspect", "--json", ck.ID)), &c); err != nil {
			t.Fatal(err)
		}
		if c.State != "committed" {
			t.Fatalf("checkpoint %s after the restart: %+v\n%s", ck.ID, c, tail(d.log(), 30))
		}
		if c.ManifestDigest != "" {
			break // uploaded
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint %s not uploaded 2 min after the restart\n%s", ck.ID, tail(d.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.must("sandbox", "rm", id)
}
