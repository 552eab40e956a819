package main

import (
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/state/audit"
)

// TestE2EAuditVerify: state-changing calls leave audit records; `amber
// audit verify` holds on the untouched trail, and names the record after
// one was edited in the daemon's database (with a valid checksum, as a
// forger with write access would).
func TestE2EAuditVerify(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "true")
	if _, _, code := d.amber("sandbox", "create", "--template", "no-such-template"); code == 0 {
		t.Fatal("create from a missing template succeeded")
	}
	d.must("sandbox", "rm", id)
	ls := d.must("audit", "ls")
	for _, want := range []string{"POST /v1/sandboxes", "POST /v1/sandboxes/{id}/exec", "DELETE /v1/sandboxes/{id}", "key:admin", "not found"} {
		if !strings.Contains(ls, want) {
			t.Errorf("audit ls lacks %q:\n%s", want, ls)
		}
	}
	if out := d.must("audit", "verify"); !strings.Contains(out, "holds: 4 records") {
		t.Fatalf("verify of the untouched trail: %q", out)
	}
	d.stop(syscall.SIGTERM)

	// Edit record 2 in the database, keeping the envelope's checksum valid.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	const where = ` WHERE seq = 2 AND sid = (SELECT sid FROM streams WHERE stream = 'audit/default')`
	var env []byte
	if err := db.QueryRow(`SELECT env FROM events` + where).Scan(&env); err != nil {
		t.Fatal(err)
	}
	ev, err := eventlog.Decode(env)
	if err != nil {
		t.Fatal(err)
	}
	var r audit.Record
	if err := json.Unmarshal(ev.Payload, &r); err != nil {
		t.Fatal(err)
	}
	r.Actor = "key:someone-else"
	ev.Payload, _ = json.Marshal(r)
	if env, err = eventlog.Encode(ev); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE events SET env = ?`+where, env); err != nil {
		t.Fatal(err)
	}
	db.Close()

	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	out, _, code := d.amber("audit", "verify")
	if code != 1 || !strings.Contains(out, "BROKEN at record 2") {
		t.Fatalf("verify of the edited trail: exit %d %q", code, out)
	}
}

// TestAuditVerifyDetectsTruncatedTail: the last records of the trail are
// cut off by SQL, rows and the stream's head both (a forger covering the
// cut); `amber audit verify` fails and names the missing records, because
// the head is anchored outside the log (DATA_DIR/audit.head). The audit
// key (DATA_DIR/audit.key) is made at first start with mode 0600.
func TestAuditVerifyDetectsTruncatedTail(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	d.must("exec", id, "--", "true")
	d.must("exec", id, "--", "true")
	d.must("sandbox", "rm", id)
	if out := d.must("audit", "verify"); !strings.Contains(out, "holds: 4 records") {
		t.Fatalf("verify of the untouched trail: %q", out)
	}
	d.stop(syscall.SIGTERM)

	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	const sid = `(SELECT sid FROM streams WHERE stream = 'audit/default')`
	if _, err := db.Exec(`DELETE FROM events WHERE sid = ` + sid + ` AND seq > 2`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE streams SET head_seq = 2 WHERE stream = 'audit/default'`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	out, _, code := d.amber("audit", "verify")
	if code != 1 || !strings.Contains(out, "BROKEN at record 3") || !strings.Contains(out, "records 3 to 4 are missing") {
		t.Fatalf("verify of the cut trail: exit %d %q", code, out)
	}
	t.Logf("cut trail: %s", strings.TrimSpace(out))
	if fi, err := os.Stat(filepath.Join(dir, "audit.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("audit.key: %v %v", fi, err)
	}
}
