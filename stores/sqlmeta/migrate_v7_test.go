package sqlmeta

import (
	"context"
	"testing"
	"time"
)

// TestMigrateV6ToV7: a database at schema 6 (sandboxes without metadata
// and deadlines) opens at 7 on both backends, its rows without either,
// and takes both after the migration.
func TestMigrateV6ToV7(t *testing.T) {
	ctx := context.Background()
	spec := newSpec(t)
	s, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, Sandbox{ID: "sbx-old", Tenant: DefaultTenant, Template: "minimal", Driver: "gvisor", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	downgrade := []string{`ALTER TABLE sandboxes DROP COLUMN metadata`, `ALTER TABLE sandboxes DROP COLUMN expires_ns`, `ALTER TABLE sandboxes DROP COLUMN on_expire`}
	if s.db.pg {
		downgrade = append(downgrade, `DELETE FROM meta_schema_version`, `INSERT INTO meta_schema_version (version) VALUES (6)`)
	} else {
		downgrade = append(downgrade, `PRAGMA user_version = 6`)
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
	sb, err := s.Get(ctx, "sbx-old")
	if err != nil || sb.Metadata != nil || !sb.Expires.IsZero() || sb.OnExpire != "" {
		t.Fatalf("migrated row: %+v %v", sb, err)
	}
	at := time.Now().Add(time.Minute).Truncate(time.Microsecond)
	if sb, err = s.SetExpiry(ctx, "sbx-old", at, "pause"); err != nil || !sb.Expires.Equal(at) {
		t.Fatalf("deadline after the migration: %+v %v", sb, err)
	}
	if sb, err = s.SetMetadata(ctx, "sbx-old", map[string]string{"k": "v"}); err != nil || sb.Metadata["k"] != "v" {
		t.Fatalf("metadata after the migration: %+v %v", sb, err)
	}
}
