// Package sqlite is Amber's embedded event log: an eventlog.Store in one
// SQLite file, through modernc.org/sqlite (pure Go, no cgo). It is the
// default backend; it passes the suite in core/eventlog/logtest.
//
// # Durability order
//
// The database runs in WAL mode with synchronous=FULL on the write
// connection, so a COMMIT returns only after the WAL frames holding the
// transaction were written and fsynced (fdatasync on Linux, see Open). An
// append is acknowledged — Append returns — only after the COMMIT that
// contains it returned. An append that is not acknowledged (error, crash,
// cancelled context) may or may not be in the log; a client retries it with
// the same event ids, which is a no-op if it had landed.
//
// When Open creates the database, the directory holding it is fsynced after
// the schema is committed, so the file's name is durable before the first
// append is acknowledged. SQLite itself fsyncs the directory when it creates
// the -wal file.
//
// # Group commit
//
// One writer goroutine owns the only write connection. It takes every pending
// write (appends, lease changes, truncations), applies each inside its own
// SAVEPOINT — so one refused append rolls back alone and does not abort the
// others — then COMMITs once, paying one fsync for all of them, and only then
// answers each caller. Reads use a separate pool of read-only connections and
// see only committed data (WAL snapshot isolation, one statement per Read).
//
// WAL checkpoints run in the background on their own connection, so no
// append waits for one.
//
// # Cost model
//
// SQLite's WAL is page-granular: a commit writes every B-tree page it
// dirtied as a 4 KiB frame (two write(2) calls each) and then syncs. Event
// rows are stored in append order, so all appends of a commit share the
// pages at the right edge of events; each stream adds the leaf of its
// (sid, seq) index and the place of its ids in event_ids. A group commit of
// N single-event appends to N long streams thus writes about 2N frames,
// while a batch of 100 events to one stream writes about 15. Ids that sort
// by time (ULIDs, UUIDv7) keep event_ids append-only; random ids dirty a
// random page each.
// Reads are cheap: one indexed range scan per Read, envelopes decoded on
// all CPUs.
package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	msqlite "modernc.org/sqlite"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Clock stamps events whose Time is zero and times leases. Default: the
	// wall clock.
	Clock clock.Clock
	// Logger receives slow commits, checkpoint failures and the like.
	// Default: slog.Default().
	Logger *slog.Logger
}

// Store is the SQLite event log. It is safe for concurrent use; see the
// package comment for how writes reach the disk.
type Store struct {
	path   string
	clk    clock.Clock
	log    *slog.Logger
	wdb    *sql.DB // one connection, owned by the writer goroutine
	rdb    *sql.DB // read-only pool
	cdb    *sql.DB // one connection for background WAL checkpoints
	w      *writer
	notify notifier

	closeOnce sync.Once
	closeErr  error
	stopCkpt  chan struct{}
	ckptDone  chan struct{}
}

var _ eventlog.Store = (*Store)(nil)
var _ eventlog.Notifier = (*Store)(nil)

// busyTimeout bounds how long a connection waits for another process's lock.
const busyTimeout = 10 * time.Second

// Open opens (creating if needed) the event log in the SQLite file at path
// and migrates its schema. Only one process should write a file at a time;
// a second one is correct (SQLite locks) but waits for the first.
//
// Open switches SQLite's commit syscall from fsync to fdatasync for the whole
// process (modernc.org/sqlite Fdatasync): it flushes the data and the size
// of the file, which is all a WAL commit needs, and skips the timestamp
// update that makes fsync wait on the file system journal.
func Open(path string, opts Options) (*Store, error) {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, errdefs.InvalidArgumentf("sqlite path %q: %v", path, err)
	}
	if _, err := msqlite.Fdatasync(true); err != nil && err != msqlite.ErrFdatasyncUnavailable {
		return nil, fmt.Errorf("sqlite: enable fdatasync: %w", err)
	}
	s := &Store{
		path:     abs,
		clk:      opts.Clock,
		log:      opts.Logger.With("component", "eventlog/sqlite", "path", abs),
		stopCkpt: make(chan struct{}),
		ckptDone: make(chan struct{}),
	}
	if err := s.open(); err != nil {
		s.closeDBs()
		return nil, err
	}
	s.w = startWriter(s)
	go s.checkpointLoop()
	return s, nil
}

func (s *Store) open() error {
	var err error
	// The write connection: WAL, synchronous=FULL, foreign keys, no
	// automatic checkpoints (checkpointLoop does them off the commit path),
	// and a WAL file cut back to 64 MiB when it restarts.
	if s.wdb, err = s.sqlOpen(false, "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)", "wal_autocheckpoint(0)", "cache_size(-65536)", "journal_size_limit(67108864)"); err != nil {
		return err
	}
	s.wdb.SetMaxOpenConns(1)
	s.wdb.SetConnMaxIdleTime(0)
	s.wdb.SetConnMaxLifetime(0)
	if err := migrate(s.wdb); err != nil {
		return fmt.Errorf("sqlite %s: migrate: %w", s.path, err)
	}
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("sqlite %s: %w", s.path, err)
	}
	// Readers map the file (no read syscall or copy per page on replay).
	if s.rdb, err = s.sqlOpen(true, "mmap_size(1073741824)", "cache_size(-16384)"); err != nil {
		return err
	}
	n := max(4, runtime.GOMAXPROCS(0))
	s.rdb.SetMaxOpenConns(n)
	s.rdb.SetMaxIdleConns(n)
	if s.cdb, err = s.sqlOpen(false, "synchronous(FULL)", "wal_autocheckpoint(0)"); err != nil {
		return err
	}
	s.cdb.SetMaxOpenConns(1)
	return nil
}

// sqlOpen opens a database/sql handle on the file with the given pragmas
// applied to each of its connections.
func (s *Store) sqlOpen(readOnly bool, pragmas ...string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	if readOnly {
		q.Set("_query_only", "1")
	} else {
		q.Set("_txlock", "immediate")
	}
	dsn := (&url.URL{Scheme: "file", Path: s.path, RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite %s: %w", s.path, err)
	}
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, errdefs.Unavailablef("sqlite %s: open: %v", s.path, err)
	}
	return db, nil
}

// syncDir fsyncs a directory so the names created in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// Durability reports the durability settings in effect on the write
// connection, read back from SQLite (not from what Open asked for):
// "journal_mode" (want "wal"), "synchronous" (want "2", FULL), "fdatasync"
// ("true" when commits sync with fdatasync rather than fsync) and
// "wal_autocheckpoint" ("0": checkpoints run in the background).
func (s *Store) Durability(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := s.w.raw(ctx, func(c *sql.Conn) error {
		for _, p := range []string{"journal_mode", "synchronous", "wal_autocheckpoint", "foreign_keys"} {
			var v string
			if err := c.QueryRowContext(ctx, "PRAGMA "+p).Scan(&v); err != nil {
				return fmt.Errorf("read pragma %s: %w", p, err)
			}
			out[p] = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out["fdatasync"] = fmt.Sprint(msqlite.FdatasyncEnabled())
	return out, nil
}

// Close stops the writer (pending appends fail with ErrUnavailable),
// checkpoints the WAL into the database file and closes every connection.
// Calling it again returns the first call's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.w.stop()
		close(s.stopCkpt)
		<-s.ckptDone
		if _, err := s.cdb.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			s.log.Warn("final checkpoint failed", "err", err)
		}
		s.closeErr = s.closeDBs()
	})
	return s.closeErr
}

func (s *Store) closeDBs() error {
	var first error
	for _, db := range []*sql.DB{s.rdb, s.cdb, s.wdb} {
		if db == nil {
			continue
		}
		if err := db.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// checkpointInterval is how often the background checkpointer copies the WAL
// into the database file when there were commits.
const checkpointInterval = 250 * time.Millisecond

// checkpointLoop keeps the WAL short in two steps. Here, off the commit
// path, a PASSIVE checkpoint (it never blocks the writer or readers) copies
// the bulk of the WAL into the database file. It then asks the writer for a
// catch-up checkpoint between two group commits (writer.catchUp), which
// copies only the few frames committed meanwhile; with the whole WAL
// copied, SQLite restarts it from the beginning at the next write, so the
// WAL file is overwritten in place instead of growing (a commit into a
// growing file also pays for a file-system journal commit).
func (s *Store) checkpointLoop() {
	defer close(s.ckptDone)
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	var done uint64
	for {
		select {
		case <-s.stopCkpt:
			return
		case <-t.C:
		}
		n := s.w.commits.Load()
		if n == done {
			continue
		}
		if _, err := s.cdb.Exec("PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
			s.log.Warn("wal checkpoint failed", "err", err)
			continue
		}
		done = n
		s.w.catchUp.Store(true)
	}
}
