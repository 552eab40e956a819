package sqlite

import (
	"database/sql"
	"fmt"
)

// migrations[i] takes the schema from version i to i+1. Append only: a
// released migration is never edited. Each runs in the same transaction as
// the version bump, so a crash mid-migration leaves the old version.
var migrations = []string{
	// 0 → 1: the log, its id index and leases.
	`
CREATE TABLE streams (
	sid       INTEGER PRIMARY KEY,
	stream    TEXT    NOT NULL UNIQUE,
	tenant    TEXT    NOT NULL,
	first_seq INTEGER NOT NULL,  -- first retained position (Truncate moves it)
	head_seq  INTEGER NOT NULL   -- last position, 0 while empty
);
-- One row per retained event. env is eventlog.Encode's envelope; its
-- stream and seq are cross-checked against the row on every read.
CREATE TABLE events (
	eid        INTEGER PRIMARY KEY, -- append order: new rows go to the right edge
	sid        INTEGER NOT NULL REFERENCES streams (sid),
	seq        INTEGER NOT NULL,
	checkpoint INTEGER NOT NULL, -- 1 when the event carries a CheckpointRef
	env        BLOB    NOT NULL
);
CREATE UNIQUE INDEX events_by_stream ON events (sid, seq);
CREATE INDEX events_checkpoints ON events (sid, seq) WHERE checkpoint = 1;
-- Every id ever appended (kept when events are truncated): idempotent
-- re-append compares digests (eventlog.ContentDigest).
CREATE TABLE event_ids (
	id     TEXT    PRIMARY KEY,
	sid    INTEGER NOT NULL REFERENCES streams (sid),
	seq    INTEGER NOT NULL,
	digest BLOB    NOT NULL  -- eventlog.ContentDigest, 32 bytes
) WITHOUT ROWID;
CREATE TABLE leases (
	stream     TEXT    PRIMARY KEY,
	holder     TEXT    NOT NULL,
	epoch      INTEGER NOT NULL,
	expires_ns INTEGER NOT NULL  -- Unix nanoseconds
) WITHOUT ROWID;
`,
}

// migrate brings db to the latest schema version. It is idempotent and safe
// against a concurrent Open of the same file (BEGIN IMMEDIATE serializes).
func migrate(db *sql.DB) error {
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	tx, err := db.Begin() // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int
	switch err := tx.QueryRow(`SELECT version FROM schema_version`).Scan(&v); err {
	case nil:
	case sql.ErrNoRows:
		if _, err := tx.Exec(`INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return err
		}
	default:
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this binary's %d; upgrade amber", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		if _, err := tx.Exec(migrations[v]); err != nil {
			return fmt.Errorf("migration %d→%d: %w", v, v+1, err)
		}
	}
	if _, err := tx.Exec(`UPDATE schema_version SET version = ?`, v); err != nil {
		return err
	}
	return tx.Commit()
}
