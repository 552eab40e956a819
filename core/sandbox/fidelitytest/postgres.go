package fidelitytest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// Fidelity item 6b (database connections and locks): a PostgreSQL server
// runs in the sandbox, and a psql client in the same sandbox holds a session
// over TCP on the sandbox's loopback with state that lives only in the
// server's backend process for that session: an application_name drawn at
// random, a session-level advisory lock, a temporary table, and an open
// transaction with an uncommitted row in a regular table. After checkpoint,
// kill and restore the same client process, over the same connection, talks
// to the same backend (same pid, same application_name, same transaction
// id), still holds the lock, and its transaction commits.
//
// The client is psql reading its commands from a FIFO that a sleeping
// process keeps open for writing, so the test feeds it commands at any time
// and psql never sees end of input. psql writes query results to a file with
// \o and renames it into place with \!, so a reader never sees half of one.

const (
	pgData   = "/var/lib/postgresql/amber"
	pgIO     = "/tmp/pgio"
	pgLockID = "4242"
)

// pgPsql is how every psql in the sandbox connects: TCP on loopback.
const pgPsql = "psql -X -q -A -t -h 127.0.0.1 -p 5432 -U postgres -d postgres"

// pgSetup makes a cluster in the sandbox's writable layer (the template has
// none) as the postgres user.
const pgSetup = `set -e
mkdir -p ` + pgData + ` ` + pgIO + `
chown postgres:postgres ` + pgData + `
chmod 0700 ` + pgData + `
setpriv --reuid=postgres --regid=postgres --init-groups initdb -D ` + pgData + ` -A trust -U postgres -E UTF8 --no-sync >/tmp/initdb.log 2>&1 || { cat /tmp/initdb.log >&2; exit 1; }
mkfifo ` + pgIO + `/in
`

// pgServerArgs start the server in the foreground. Dynamic shared memory
// as files in the data directory (mmap), not /dev/shm, which a sandbox may
// not have.
var pgServerArgs = []string{
	"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
	"postgres", "-D", pgData, "-c", "listen_addresses=127.0.0.1", "-c", "port=5432",
	"-c", "unix_socket_directories=/tmp", "-c", "shared_buffers=16MB", "-c", "max_connections=20",
	"-c", "dynamic_shared_memory_type=mmap", "-c", "huge_pages=off", "-c", "logging_collector=off",
}

// pgSession is what the client's session runs before the cut; it leaves
// the transaction open and writes "pid|application_name|txid" to before.
const pgSession = `SELECT set_config('application_name', 'amber-' || md5(random()::text), false) \g /dev/null
SELECT pg_advisory_lock(` + pgLockID + `) \g /dev/null
BEGIN;
CREATE TEMP TABLE scratch(v text);
INSERT INTO scratch SELECT current_setting('application_name');
INSERT INTO kept SELECT current_setting('application_name');
\o ` + pgIO + `/before.tmp
SELECT pg_backend_pid(), current_setting('application_name'), txid_current();
\o
\! mv ` + pgIO + `/before.tmp ` + pgIO + `/before
`

// pgAfter asks the session, after the cut, for the same values and the
// temporary table's content: "pid|application_name|txid|scratch".
const pgAfter = `\o ` + pgIO + `/after.tmp
SELECT pg_backend_pid(), current_setting('application_name'), txid_current(), (SELECT string_agg(v, ',') FROM scratch);
\o
\! mv ` + pgIO + `/after.tmp ` + pgIO + `/after
`

// pgRun is the database workload of one sandbox as seen before the cut.
type pgRun struct {
	server, holder, client int
	ticks                  map[int]uint64
	backend                string // the session's backend pid
	app                    string // its application_name
	xid                    string // its open transaction's id
}

// feed writes psql commands to the client's FIFO.
func feed(d Driver, id, cmds string) error {
	_, err := sh(d, id, "cat > "+pgIO+"/in <<'EOF'\n"+cmds+"EOF", time.Minute)
	return err
}

// waitFile waits for a file the client renames into place and returns its
// content.
func waitFile(d Driver, id, path string, timeout time.Duration) (string, error) {
	return sh(d, id, fmt.Sprintf(`for i in $(seq %d); do [ -e %s ] && exec cat %s; sleep 0.1; done; echo "no %s" >&2; exit 1`,
		int(timeout/(100*time.Millisecond)), path, path, path), timeout+time.Minute)
}

// query runs one SQL statement in a new session (its own psql) and
// returns its output.
func query(d Driver, id, sql string) (string, error) {
	out, err := sh(d, id, pgPsql+` -c "`+sql+`"`, time.Minute)
	return strings.TrimSpace(out), err
}

// startPostgres starts the server and the client's session in sandbox id.
func startPostgres(t *testing.T, d Driver, id string) pgRun {
	t.Helper()
	mustSh(t, d, id, pgSetup)
	var r pgRun
	r.server = start(t, d, id, pgServerArgs...)
	if _, err := sh(d, id, `for i in $(seq 300); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 0.1; done; exit 1`, time.Minute); err != nil {
		t.Fatalf("postgres never got ready in %s: %v\nserver log:\n%s", id, err, procLog(d, id, r.server))
	}
	mustSh(t, d, id, pgPsql+` -c "CREATE TABLE kept(v text)"`)
	r.holder = start(t, d, id, "/bin/sh", "-c", "exec sleep 1000000 > "+pgIO+"/in")
	r.client = start(t, d, id, "/bin/sh", "-c", "exec "+pgPsql+" < "+pgIO+"/in")
	if err := feed(d, id, pgSession); err != nil {
		t.Fatal(err)
	}
	out, err := waitFile(d, id, pgIO+"/before", 30*time.Second)
	if err != nil {
		t.Fatalf("the session never started in %s: %v\npsql log:\n%s", id, err, procLog(d, id, r.client))
	}
	f := strings.Split(strings.TrimSpace(out), "|")
	if len(f) != 3 || !strings.HasPrefix(f[1], "amber-") {
		t.Fatalf("session in %s: %q", id, out)
	}
	r.backend, r.app, r.xid = f[0], f[1], f[2]
	// Seen from another session: the transaction is open, its row not
	// visible, the lock taken.
	if got, err := query(d, id, "SELECT state FROM pg_stat_activity WHERE pid = "+r.backend); err != nil || got != "idle in transaction" {
		t.Fatalf("session %s in %s: state %q %v", r.backend, id, got, err)
	}
	if got, err := query(d, id, "SELECT count(*) FROM kept"); err != nil || got != "0" {
		t.Fatalf("uncommitted row visible in %s: %q %v", id, got, err)
	}
	if r.ticks, err = ticks(d, id, r.server, r.holder, r.client); err != nil || len(r.ticks) != 3 {
		t.Fatalf("server %d, holder %d and psql %d in %s: %v %v", r.server, r.holder, r.client, id, r.ticks, err)
	}
	return r
}

// checkPostgres checks the database in sandbox id against before, part by
// part, and finally commits the session's transaction through the client.
func checkPostgres(d Driver, id string, before pgRun) []part {
	var parts []part
	p := func(name string, err error) { parts = append(parts, part{name, err}) }

	now, err := ticks(d, id, before.server, before.holder, before.client)
	switch {
	case err != nil:
		p("processes", err)
	case fmt.Sprint(now) != fmt.Sprint(before.ticks):
		p("processes", fmt.Errorf("server, holder and psql (pid → start ticks) %v, before the cut %v", now, before.ticks))
	default:
		p("processes", nil)
	}

	// The server's unix socket (a file in the writable layer, bound again
	// by the restore) takes new sessions too.
	if got, err := sh(d, id, `psql -X -q -A -t -h /tmp -p 5432 -U postgres -d postgres -c "SELECT 'unix'"`, time.Minute); err != nil {
		p("unix-socket", err)
	} else if strings.TrimSpace(got) != "unix" {
		p("unix-socket", fmt.Errorf("answer %q", got))
	} else {
		p("unix-socket", nil)
	}

	// The server's view, from a new session.
	want := before.app + "|idle in transaction|" + before.xid
	if got, err := query(d, id, "SELECT application_name, state, backend_xid FROM pg_stat_activity WHERE pid = "+before.backend); err != nil {
		p("server-session", err)
	} else if got != want {
		p("server-session", fmt.Errorf("backend %s: %q, before the cut %q", before.backend, got, want))
	} else {
		p("server-session", nil)
	}
	lockSQL := fmt.Sprintf("SELECT a.pid || '|' || a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "+
		"WHERE l.locktype = 'advisory' AND l.objid = %s AND l.granted", pgLockID)
	if got, err := query(d, id, lockSQL); err != nil {
		p("advisory-lock", err)
	} else if got != before.backend+"|"+before.app {
		p("advisory-lock", fmt.Errorf("held by %q, before the cut by %q", got, before.backend+"|"+before.app))
	} else if try, err := query(d, id, fmt.Sprintf("SELECT pg_try_advisory_lock(%s)", pgLockID)); err != nil || try != "f" {
		p("advisory-lock", fmt.Errorf("another session could take it: %q %v", try, err))
	} else {
		p("advisory-lock", nil)
	}

	// The client's view: same backend, same transaction, temp table there.
	if err := feed(d, id, pgAfter); err != nil {
		p("client-session", err)
	} else if out, err := waitFile(d, id, pgIO+"/after", 30*time.Second); err != nil {
		p("client-session", fmt.Errorf("no answer from the session: %v; psql log: %q", err, procLog(d, id, before.client)))
	} else if got, want := strings.TrimSpace(out), before.backend+"|"+before.app+"|"+before.xid+"|"+before.app; got != want {
		p("client-session", fmt.Errorf("backend|application_name|txid|temp table %q, before the cut %q", got, want))
	} else {
		p("client-session", nil)
	}

	// The transaction commits: its row becomes visible to other sessions.
	if err := feed(d, id, "COMMIT;\n"); err != nil {
		p("commit", err)
	} else {
		var got string
		var err error
		for i := 0; i < 50; i++ {
			if got, err = query(d, id, "SELECT count(*) FROM kept WHERE v = '"+before.app+"'"); err == nil && got == "1" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if got != "1" {
			p("commit", fmt.Errorf("the session's row is not committed (%q %v); psql log: %q", got, err, procLog(d, id, before.client)))
		} else {
			p("commit", nil)
		}
	}
	return parts
}

// Postgres is fidelity item 6b: a live database session (backend, lock,
// temp table, open transaction) survives checkpoint, kill and restore, and
// the same check fails on a fresh sandbox.
func Postgres(t *testing.T, d Driver, tmpl sandbox.Template) {
	lap := lapper(t)
	spec := create(t, d, "pg", tmpl)
	before := startPostgres(t, d, spec.ID)
	lap(fmt.Sprintf("session open: backend %s application_name %s txid %s", before.backend, before.app, before.xid))
	if _, err := cut(t, d, spec, lap); err != nil {
		t.Fatal(err)
	}
	parts := checkPostgres(d, spec.ID, before)
	if failed := report(t, "after restore", parts); len(failed) > 0 {
		t.Errorf("after restore, lost: %s\nserver log:\n%s", strings.Join(failed, ", "), procLog(d, spec.ID, before.server))
	}
	lap("checked")
	if err := d.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}

	// Control: the same workload in a sandbox never restored.
	ctl := create(t, d, "pg-fresh", tmpl)
	fresh := startPostgres(t, d, ctl.ID)
	t.Logf("fresh sandbox: backend %s application_name %s txid %s", fresh.backend, fresh.app, fresh.xid)
	cparts := checkPostgres(d, ctl.ID, before)
	report(t, "fresh sandbox", cparts)
	for _, p := range cparts {
		if p.name != "processes" && p.name != "unix-socket" && p.err == nil {
			t.Errorf("fresh sandbox: the %s check passed against the session of another sandbox: it cannot tell restored from restarted", p.name)
		}
	}
	lap("control checked")
}
