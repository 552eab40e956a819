package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// maxGroup bounds how many writes share one COMMIT.
const maxGroup = 1024

// slowCommit is logged.
const slowCommit = 250 * time.Millisecond

// An op is one write waiting for the writer goroutine.
type op struct {
	ctx context.Context
	// apply runs inside the op's own SAVEPOINT; an error rolls back to it.
	// errRetry asks for one more call after the rollback.
	apply func(w *writer) error
	// raw, when set instead of apply, runs alone outside any transaction.
	raw func(c *sql.Conn) error
	// notify names the stream whose subscribers wake after the commit.
	notify string
	done   chan error
}

// errRetry, returned by op.apply, rolls back the op's savepoint and calls
// apply again (appendOp uses it to switch to its duplicate check).
var errRetry = errors.New("retry after savepoint rollback")

// writer owns the write connection and commits in groups (see the package
// comment).
type writer struct {
	s      *Store
	conn   *sql.Conn
	st     stmts
	ops    chan *op // unbuffered: a send succeeds only when the writer takes it
	quit   chan struct{}
	exited chan struct{}
	// commits counts successful COMMITs (checkpointLoop watches it) and
	// committed the ops in them.
	commits, committed atomic.Uint64
	// catchUp asks for a checkpoint on the write connection between two
	// groups (see Store.checkpointLoop).
	catchUp atomic.Bool
	// startErr is set when the writer could not start; every op gets it.
	startErr error
}

func startWriter(s *Store) *writer {
	w := &writer{s: s, ops: make(chan *op), quit: make(chan struct{}), exited: make(chan struct{})}
	ctx := context.Background()
	conn, err := s.wdb.Conn(ctx)
	if err == nil {
		w.conn = conn
		err = w.st.prepare(ctx, conn)
	}
	if err != nil {
		w.startErr = errdefs.Unavailablef("sqlite %s: start writer: %v", s.path, err)
	}
	go w.loop()
	return w
}

func (w *writer) stop() {
	close(w.quit)
	<-w.exited
	w.st.close()
	if w.conn != nil {
		w.conn.Close()
	}
}

// submit hands o to the writer and waits for its answer. When ctx ends
// after the writer took o, the outcome is unknown to the caller (the write
// may still commit); retrying an append with the same ids is safe.
func (w *writer) submit(ctx context.Context, o *op) error {
	o.ctx = ctx
	o.done = make(chan error, 1)
	select {
	case w.ops <- o:
	case <-ctx.Done():
		return ctx.Err()
	case <-w.quit:
		return errdefs.Unavailablef("sqlite %s: store is closed", w.s.path)
	}
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// raw runs fn on the write connection outside any transaction.
func (w *writer) raw(ctx context.Context, fn func(c *sql.Conn) error) error {
	return w.submit(ctx, &op{raw: fn})
}

func (w *writer) loop() {
	defer close(w.exited)
	group := make([]*op, 0, maxGroup)
	for {
		var first *op
		select {
		case first = <-w.ops:
		case <-w.quit:
			return
		}
		if w.startErr != nil {
			first.done <- w.startErr
			continue
		}
		if first.raw != nil {
			first.done <- first.raw(w.conn)
			continue
		}
		group = append(group[:0], first)
		var rawOp *op
	drain:
		for len(group) < maxGroup {
			select {
			case o := <-w.ops:
				if o.raw != nil {
					rawOp = o
					break drain
				}
				group = append(group, o)
			default:
				break drain
			}
		}
		w.commitGroup(group)
		if rawOp != nil {
			rawOp.done <- rawOp.raw(w.conn)
		}
		if w.catchUp.Swap(false) {
			if _, err := w.conn.ExecContext(bg, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
				w.s.log.Warn("catch-up wal checkpoint failed", "err", err)
			}
		}
	}
}

// commitGroup applies every op of group in its own savepoint inside one
// transaction, commits once, and only then answers the callers.
func (w *writer) commitGroup(group []*op) {
	start := time.Now()
	errs := make([]error, len(group))
	fail := func(err error) {
		for i, o := range group {
			if errs[i] == nil {
				errs[i] = err
			}
			o.done <- errs[i]
		}
	}
	if err := w.st.exec(w.st.begin); err != nil {
		fail(dbErr(w.s.path, "begin", err))
		return
	}
	for i, o := range group {
		if err := o.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		err, fatal := w.applyOne(o)
		if fatal != nil {
			w.st.exec(w.st.rollback)
			fail(dbErr(w.s.path, "apply", fatal))
			return
		}
		errs[i] = err
	}
	// Durability point: COMMIT returns after the WAL is fsynced
	// (synchronous=FULL). Nobody hears about an op before this.
	if err := w.st.exec(w.st.commit); err != nil {
		w.st.exec(w.st.rollback)
		fail(dbErr(w.s.path, "commit", err))
		return
	}
	w.commits.Add(1)
	w.committed.Add(uint64(len(group)))
	for i, o := range group {
		if errs[i] == nil && o.notify != "" {
			w.s.notify.wake(o.notify)
		}
		o.done <- errs[i]
	}
	if d := time.Since(start); d > slowCommit {
		w.s.log.Warn("slow group commit", "ops", len(group), "duration", d)
	}
}

// applyOne runs o inside a savepoint. err is o's own answer; fatal means
// the transaction itself is broken and the group must be abandoned.
func (w *writer) applyOne(o *op) (err, fatal error) {
	if e := w.st.exec(w.st.savepoint); e != nil {
		return nil, e
	}
	err = o.apply(w)
	if errors.Is(err, errRetry) {
		if e := w.st.exec(w.st.rollbackTo); e != nil {
			return nil, e
		}
		err = o.apply(w)
	}
	if err != nil {
		if e := w.st.exec(w.st.rollbackTo); e != nil {
			return nil, e
		}
		err = dbErr(w.s.path, "write", err)
	}
	if e := w.st.exec(w.st.release); e != nil {
		return nil, e
	}
	return err, nil
}

// dbErr turns a database failure into an error kind: SQLite's corruption
// codes are ErrDataLoss, a cancelled context stays itself, everything else
// is ErrUnavailable.
func dbErr(path, what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("sqlite %s: %s: %w", path, what, err)
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return errdefs.DataLossf("sqlite %s: %s: %v", path, what, err)
		}
	}
	if errdefs.Kind(err) != "internal" {
		return err
	}
	return errdefs.Unavailablef("sqlite %s: %s: %v", path, what, err)
}

// stmts are the write connection's prepared statements.
type stmts struct {
	begin, commit, rollback        *sql.Stmt
	savepoint, rollbackTo, release *sql.Stmt
	lookup, newStream, setHead     *sql.Stmt
	insID, insEvent, getID         *sql.Stmt
	all                            []*sql.Stmt
}

func (st *stmts) prepare(ctx context.Context, c *sql.Conn) error {
	for _, p := range []struct {
		dst **sql.Stmt
		sql string
	}{
		{&st.begin, `BEGIN IMMEDIATE`},
		{&st.commit, `COMMIT`},
		{&st.rollback, `ROLLBACK`},
		{&st.savepoint, `SAVEPOINT op`},
		{&st.rollbackTo, `ROLLBACK TO op`},
		{&st.release, `RELEASE op`},
		{&st.lookup, `SELECT s.sid, s.tenant, s.head_seq, COALESCE(l.epoch, 0)
			FROM (SELECT ?1 AS name) q
			LEFT JOIN streams s ON s.stream = q.name
			LEFT JOIN leases l ON l.stream = q.name`},
		{&st.newStream, `INSERT INTO streams (stream, tenant, first_seq, head_seq) VALUES (?, ?, 1, 0) RETURNING sid`},
		{&st.setHead, `UPDATE streams SET head_seq = ? WHERE sid = ?`},
		{&st.insID, `INSERT INTO event_ids (id, sid, seq, digest) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`},
		{&st.insEvent, `INSERT INTO events (sid, seq, checkpoint, env) VALUES (?, ?, ?, ?)`},
		{&st.getID, `SELECT seq, digest FROM event_ids WHERE id = ?`},
	} {
		s, err := c.PrepareContext(ctx, p.sql)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", p.sql, err)
		}
		*p.dst = s
		st.all = append(st.all, s)
	}
	return nil
}

func (st *stmts) exec(s *sql.Stmt, args ...any) error {
	_, err := s.Exec(args...)
	return err
}

func (st *stmts) close() {
	for _, s := range st.all {
		s.Close()
	}
}

// bg is the context of statements the writer runs for an op: once an op is
// applied, the caller's context no longer interrupts it (its savepoint
// decides).
var bg = context.Background()
