package sqlmeta

import (
	"context"
	"testing"
)

// TestMigrateV5ToV6: a database at schema 5 (checkpoints without the
// upload mark) opens at 6 on both backends, its rows unmarked.
func TestMigrateV5ToV6(t *testing.T) {
	ctx := context.Background()
	spec := newSpec(t)
	s, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.InsertCheckpoint(ctx, Checkpoint{ID: "ckpt-old", Tenant: DefaultTenant, SandboxID: "sbx-1", State: CheckpointPending}); err != nil {
		t.Fatal(err)
	}
	// Back to schema 5 (without schema 7's columns too).
	downgrade := []string{`ALTER TABLE checkpoints DROP COLUMN upload_pending`, `ALTER TABLE checkpoints DROP COLUMN hot_digest`,
		`ALTER TABLE sandboxes DROP COLUMN metadata`, `ALTER TABLE sandboxes DROP COLUMN expires_ns`, `ALTER TABLE sandboxes DROP COLUMN on_expire`}
	if s.db.pg {
		downgrade = append(downgrade, `DELETE FROM meta_schema_version`, `INSERT INTO meta_schema_version (version) VALUES (5)`)
	} else {
		downgrade = append(downgrade, `PRAGMA user_version = 5`)
	}
	for _, q := range downgrade {
		if _, err := s.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s.Close()

	if s, err = Open(spec, Options{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ck, err := s.Checkpoint(ctx, "ckpt-old")
	if err != nil || ck.UploadPending || ck.HotDigest != "" {
		t.Fatalf("migrated row: %+v %v", ck, err)
	}
	if ck, err = s.CommitCheckpoint(ctx, Checkpoint{ID: "ckpt-old", UploadPending: true, HotDigest: "sha256:h"}); err != nil || !ck.UploadPending {
		t.Fatalf("local commit after the migration: %+v %v", ck, err)
	}
}
