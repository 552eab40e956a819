package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

const checkpointSchema = `
CREATE TABLE IF NOT EXISTS checkpoints (
	id               TEXT PRIMARY KEY,
	tenant           TEXT NOT NULL,
	sandbox_id       TEXT NOT NULL,
	state            TEXT NOT NULL,
	reason           TEXT NOT NULL,
	parent           TEXT NOT NULL,
	tag              TEXT NOT NULL,
	stream           TEXT NOT NULL,
	seq              INTEGER NOT NULL,
	event_seq        INTEGER NOT NULL,
	driver           TEXT NOT NULL,
	template         TEXT NOT NULL,
	template_version TEXT NOT NULL,
	manifest_digest  TEXT NOT NULL,
	image_digest     TEXT NOT NULL,
	stats            TEXT NOT NULL,
	created_ns       INTEGER NOT NULL,
	updated_ns       INTEGER NOT NULL,
	upload_pending   INTEGER NOT NULL DEFAULT 0,
	hot_digest       TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX IF NOT EXISTS checkpoints_sandbox ON checkpoints(sandbox_id, created_ns);
CREATE INDEX IF NOT EXISTS checkpoints_state ON checkpoints(state);
`

const ckCols = `id, tenant, sandbox_id, state, reason, parent, tag, stream, seq, event_seq, driver, template,
	template_version, manifest_digest, image_digest, stats, created_ns, updated_ns, upload_pending, hot_digest`

// checkpointColumnsV6 are the columns schema version 6 added (the
// migration of both backends).
const checkpointColumnsV6 = `ALTER TABLE checkpoints ADD COLUMN upload_pending INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE checkpoints ADD COLUMN hot_digest TEXT NOT NULL DEFAULT '';`

// InsertCheckpoint records a new checkpoint (normally pending).
func (s *Store) InsertCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error) {
	if c.ID == "" || c.Tenant == "" || c.SandboxID == "" || c.State == "" {
		return c, errdefs.InvalidArgumentf("meta insert checkpoint: id, tenant, sandbox and state are required")
	}
	now := s.clock.Now()
	c.Created, c.Updated = now, now
	stats, _ := json.Marshal(c.Stats)
	_, err := s.db.ExecContext(ctx, `INSERT INTO checkpoints (`+ckCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		c.ID, c.Tenant, c.SandboxID, string(c.State), c.Reason, c.Parent, c.Tag, c.Stream, int64(c.Seq), int64(c.EventSeq),
		c.Driver, c.Template, c.TemplateVersion, c.ManifestDigest, c.ImageDigest, string(stats), now.UnixNano(), now.UnixNano(),
		c.UploadPending, c.HotDigest)
	if err != nil {
		if isUnique(err) {
			return c, errdefs.AlreadyExistsf("checkpoint %s", c.ID)
		}
		return c, fmt.Errorf("meta insert checkpoint %s: %w", c.ID, err)
	}
	return c, nil
}

// Checkpoint returns the checkpoint with id (ErrNotFound if there is none).
func (s *Store) Checkpoint(ctx context.Context, id string) (Checkpoint, error) {
	c, err := scanCheckpoint(s.db.QueryRowContext(ctx, `SELECT `+ckCols+` FROM checkpoints WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return c, errdefs.NotFoundf("checkpoint %s", id)
	}
	return c, err
}

// Checkpoints returns the matching checkpoints, oldest first.
func (s *Store) Checkpoints(ctx context.Context, f CheckpointFilter) ([]Checkpoint, error) {
	where, args := []string{"1 = 1"}, []any{}
	if f.Tenant != "" {
		where, args = append(where, "tenant = ?"), append(args, f.Tenant)
	}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+ckCols+` FROM checkpoints WHERE `+strings.Join(where, " AND ")+` ORDER BY created_ns, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("meta list checkpoints: %w", err)
	}
	defer rows.Close()
	var out []Checkpoint
	for rows.Next() {
		c, err := scanCheckpoint(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// CommitCheckpoint marks pending checkpoint c.ID committed with c's digests,
// event position and stats, and its UploadPending and HotDigest.
func (s *Store) CommitCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error) {
	stats, _ := json.Marshal(c.Stats)
	return s.updateCheckpoint(ctx, c.ID, "commit",
		`UPDATE checkpoints SET state = ?, manifest_digest = ?, image_digest = ?, event_seq = ?, stats = ?, updated_ns = ?,
		 upload_pending = ?, hot_digest = ?
		 WHERE id = ? AND state = ?`,
		string(CheckpointCommitted), c.ManifestDigest, c.ImageDigest, int64(c.EventSeq), string(stats), s.clock.Now().UnixNano(),
		c.UploadPending, c.HotDigest, c.ID, string(CheckpointPending))
}

// FinishUpload records that committed checkpoint c.ID, whose upload was
// pending, is in the blob store: its digests and stats, the mark cleared.
func (s *Store) FinishUpload(ctx context.Context, c Checkpoint) (Checkpoint, error) {
	stats, _ := json.Marshal(c.Stats)
	return s.updateCheckpoint(ctx, c.ID, "finish upload of",
		`UPDATE checkpoints SET manifest_digest = ?, image_digest = ?, stats = ?, updated_ns = ?, upload_pending = 0
		 WHERE id = ? AND state = ? AND upload_pending = 1`,
		c.ManifestDigest, c.ImageDigest, string(stats), s.clock.Now().UnixNano(), c.ID, string(CheckpointCommitted))
}

// SetCheckpointState moves checkpoint id to state to with reason, provided
// it is in one of from (any when empty).
func (s *Store) SetCheckpointState(ctx context.Context, id string, to CheckpointState, reason string, from ...CheckpointState) (Checkpoint, error) {
	q := `UPDATE checkpoints SET state = ?, reason = ?, updated_ns = ? WHERE id = ?`
	args := []any{string(to), reason, s.clock.Now().UnixNano(), id}
	if len(from) > 0 {
		q += ` AND state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(from)), ",") + `)`
		for _, st := range from {
			args = append(args, string(st))
		}
	}
	return s.updateCheckpoint(ctx, id, "set state "+string(to), q, args...)
}

func (s *Store) updateCheckpoint(ctx context.Context, id, what, q string, args ...any) (Checkpoint, error) {
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("meta %s checkpoint %s: %w", what, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Checkpoint{}, fmt.Errorf("meta %s checkpoint %s: %w", what, id, err)
	}
	cur, gerr := s.Checkpoint(ctx, id)
	if gerr != nil {
		return cur, gerr
	}
	if n == 0 {
		return cur, errdefs.FailedPreconditionf("%s checkpoint %s: it is %s", what, id, cur.State)
	}
	return cur, nil
}

func scanCheckpoint(r scanner) (Checkpoint, error) {
	var c Checkpoint
	var state, stats string
	var seq, eventSeq, created, updated int64
	err := r.Scan(&c.ID, &c.Tenant, &c.SandboxID, &state, &c.Reason, &c.Parent, &c.Tag, &c.Stream, &seq, &eventSeq,
		&c.Driver, &c.Template, &c.TemplateVersion, &c.ManifestDigest, &c.ImageDigest, &stats, &created, &updated,
		&c.UploadPending, &c.HotDigest)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return c, err
		}
		return c, fmt.Errorf("meta scan checkpoint: %w", err)
	}
	if err := json.Unmarshal([]byte(stats), &c.Stats); err != nil {
		return c, errdefs.DataLossf("meta: checkpoint %s has undecodable stats: %v", c.ID, err)
	}
	c.State = CheckpointState(state)
	c.Seq, c.EventSeq = uint64(seq), uint64(eventSeq)
	c.Created = time.Unix(0, created).UTC()
	c.Updated = time.Unix(0, updated).UTC()
	return c, nil
}
