package sqlmeta

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/lib/failpoint"
)

// TestStoreFailpoints: with Options.Failpoints, "meta.write" is evaluated
// before a statement and before a transaction; an armed point fails the
// call and the database is not touched (the claim it would have written is
// absent afterwards). "meta.read" fails queries the same way. Without
// failpoints nothing is evaluated.
func TestStoreFailpoints(t *testing.T) {
	ctx := context.Background()
	fps := failpoint.New()
	s, err := Open(filepath.Join(t.TempDir(), "meta.db"), Options{Failpoints: fps})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fps.Hits(WritePoint) != 0 {
		t.Fatalf("the migration at Open counted %d hits; the point starts after it", fps.Hits(WritePoint))
	}

	boom := errors.New("injected")
	fps.Arm(WritePoint, 1, boom)
	if _, _, err := s.BeginIdempotent(ctx, "t1", "k1", "h", time.Minute); !errors.Is(err, boom) {
		t.Fatalf("statement with the point armed: %v, want the injected error", err)
	}
	if _, err := s.db.BeginTx(ctx, nil); !errors.Is(err, boom) {
		t.Fatalf("transaction with the point armed: %v, want the injected error", err)
	}
	fps.Disarm(WritePoint)
	prev, claimed, err := s.BeginIdempotent(ctx, "t1", "k1", "h", time.Minute)
	if err != nil || !claimed || prev.Done {
		t.Fatalf("after the window: claimed=%v %+v %v; the failed call must have written nothing", claimed, prev, err)
	}
	if n := fps.Hits(WritePoint); n < 3 {
		t.Fatalf("point hit %d times, want at least 3", n)
	}

	// Reads: a query and a single-row query fail with the injected error
	// (not "no rows"), and work again once disarmed.
	if _, err := s.CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	fps.Arm(ReadPoint, 1, boom)
	if _, err := s.ListTenants(ctx); !errors.Is(err, boom) {
		t.Fatalf("list with meta.read armed: %v, want the injected error", err)
	}
	if _, err := s.GetTenant(ctx, "acme"); !errors.Is(err, boom) {
		t.Fatalf("get with meta.read armed: %v, want the injected error", err)
	}
	fps.Disarm(ReadPoint)
	if got, err := s.GetTenant(ctx, "acme"); err != nil || got.ID != "acme" {
		t.Fatalf("get after the window: %+v %v", got, err)
	}
	if n := fps.Hits(ReadPoint); n < 3 {
		t.Fatalf("meta.read hit %d times, want at least 3", n)
	}

	// A hang (failpoint.Hang) gets the call's context: the read ends
	// with its deadline, as one to a database that stopped answering.
	release := make(chan struct{})
	defer close(release)
	fps.ArmCtx(ReadPoint, 1, true, failpoint.Hang(release))
	hctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.GetTenant(hctx, "acme"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get with meta.read hung: %v, want the call's deadline", err)
	}
	fps.Disarm(ReadPoint)

	// Production: no failpoints, nothing evaluated (and nothing fails).
	p, err := Open(filepath.Join(t.TempDir(), "meta.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, claimed, err := p.BeginIdempotent(ctx, "t1", "k1", "h", time.Minute); err != nil || !claimed {
		t.Fatalf("without failpoints: claimed=%v %v", claimed, err)
	}
}
