package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// sqliteTxWriterPy opens a write transaction on a SQLite database in the
// layer (BEGIN IMMEDIATE: it holds the database's write lock), inserts a
// row tagged with a random value held only in memory, and inserts a second
// row and commits once /root/go exists.
const sqliteTxWriterPy = `
import os, random, sqlite3, time
r = random.getrandbits(64)
db = sqlite3.connect("/root/db.sqlite", isolation_level=None, timeout=0)
db.execute("create table if not exists t(v text)")
db.execute("begin immediate")
db.execute("insert into t values (?)", ("before-%d" % r,))
print("locked %d" % r, flush=True)
while not os.path.exists("/root/go"):
    time.sleep(0.05)
db.execute("insert into t values (?)", ("after-%d" % r,))
db.execute("commit")
print("committed", flush=True)
time.sleep(1000000)
`

// sqliteTx is the open transaction of one sandbox as seen before the cut.
type sqliteTx struct {
	pid   int
	ticks uint64
	rnd   string // the writer's random value
}

// startSQLiteTx starts the writer in sandbox id and returns once its
// transaction is open.
func startSQLiteTx(t *testing.T, d *Driver, id string) sqliteTx {
	t.Helper()
	pid, err := d.Start(context.Background(), id, sandbox.ExecSpec{Args: []string{"python3", "-c", sqliteTxWriterPy}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := waitProcLog(d, id, pid, "locked ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.Processes(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ticks, ok := pidTicks(ps, pid)[pid]
	if !ok {
		t.Fatalf("writer %d not among %+v", pid, ps)
	}
	return sqliteTx{pid: pid, ticks: ticks, rnd: strings.TrimPrefix(l, "locked ")}
}

// errOtherRows is the failure a fresh sandbox must show: the table does not
// hold the rows of the transaction of before the cut.
var errOtherRows = errors.New("not the rows of the transaction of before the cut")

// checkSQLiteTx checks sandbox id against the transaction before. procs:
// the writer is the same process (PID and start ticks). tx: it still
// holds the lock (a second writer is refused at once); let go, it
// commits; the table then holds its two rows, tagged with its random
// value of before, and the database passes SQLite's integrity check.
func checkSQLiteTx(d *Driver, id string, before sqliteTx) (procs, tx error) {
	ps, err := d.Processes(context.Background(), id)
	if err != nil {
		return err, err
	}
	if ticks, ok := pidTicks(ps, before.pid)[before.pid]; !ok || ticks != before.ticks {
		procs = fmt.Errorf("writer %d: start ticks %d (present %v), want %d", before.pid, ticks, ok, before.ticks)
	}
	return procs, checkSQLiteCommit(d, id, before)
}

// checkSQLiteCommit is checkSQLiteTx's tx.
func checkSQLiteCommit(d *Driver, id string, before sqliteTx) error {
	out, err := sh(d, id, `python3 -c 'import sqlite3; sqlite3.connect("/root/db.sqlite", timeout=0, isolation_level=None).execute("begin immediate")' 2>&1; echo "exit $?"`)
	if err != nil {
		return err
	}
	if strings.HasSuffix(strings.TrimSpace(out), "exit 0") {
		return fmt.Errorf("a second writer got the lock: the transaction's lock is gone")
	}
	if !strings.Contains(out, "locked") {
		return fmt.Errorf("second writer: %s", out)
	}
	if _, err := sh(d, id, "touch /root/go"); err != nil {
		return err
	}
	// The writer commits and lets go of the lock: wait for the lock (a
	// busy timeout), then read.
	out, err = sh(d, id, `python3 -c '
import sqlite3
db = sqlite3.connect("/root/db.sqlite", timeout=30, isolation_level=None)
db.execute("begin immediate")
db.execute("rollback")
print(sorted(v for (v,) in db.execute("select v from t")))
print(db.execute("pragma integrity_check").fetchone()[0])'`)
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("['after-%s', 'before-%s']\nok", before.rnd, before.rnd); strings.TrimSpace(out) != want {
		return fmt.Errorf("%w: rows and integrity check %q, want %q", errOtherRows, strings.TrimSpace(out), want)
	}
	return nil
}

// TestCheckpointSQLite is fidelity item 6 (SQLite) for the gvisor driver,
// as drivers/criu's test of the same name: a process with an open write
// transaction, holding the database's lock, is checkpointed, the sandbox
// SIGKILLed and restored; the lock is still held and the transaction
// commits afterwards. The same check run against a fresh sandbox that was
// never restored must fail.
//
//	go test -tags seccomp -count=1 -run TestCheckpointSQLite -v ./drivers/gvisor
func TestCheckpointSQLite(t *testing.T) {
	runsc := requireHost(t)
	tmpl := fidelitytest.PythonTemplate(t)
	ctx := context.Background()
	start := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	d := newTestDriver(t, runsc, "/amber/gvisor-sqlite")
	id := fmt.Sprintf("sql-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	before := startSQLiteTx(t, d, id)
	lap(fmt.Sprintf("transaction open (writer %d, r=%s)", before.pid, before.rnd))

	imageDir := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	lap("checkpointed, killed and restored")
	procs, tx := checkSQLiteTx(d, id, before)
	if procs != nil {
		t.Errorf("after restore: %v", procs)
	}
	if tx != nil {
		t.Errorf("after restore: %v", tx)
	}
	lap("checked")
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}

	// Control: a fresh sandbox with the same workload, never restored.
	ctl := id + "-fresh"
	if _, err := d.Create(ctx, sandbox.Spec{ID: ctl, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), ctl) })
	startSQLiteTx(t, d, ctl)
	procs, tx = checkSQLiteTx(d, ctl, before)
	if !errors.Is(tx, errOtherRows) {
		t.Errorf("the transaction check on a fresh sandbox that was never restored: %v, want %v", tx, errOtherRows)
	} else {
		t.Logf("on a fresh sandbox the transaction check fails as it must: %v", tx)
	}
	t.Logf("on a fresh sandbox the process check says: %v", procs)
	if err := d.Destroy(ctx, ctl); err != nil {
		t.Fatal(err)
	}
	lap("control checked")
}
