package sqlmeta

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

func open(t *testing.T) (*Store, string) {
	t.Helper()
	path := newSpec(t)
	s, err := Open(path, Options{Clock: clock.NewFake(time.Unix(1700000000, 0))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func row(id string, pooled bool) Sandbox {
	tenant := "default"
	if pooled {
		tenant = ""
	}
	return Sandbox{ID: id, Tenant: tenant, Template: "minimal", TemplateVersion: "v1", Driver: "gvisor",
		Limits: sandbox.Limits{MemoryBytes: 256 << 20}, Env: []string{"A=1"}, State: StateRunning, Pooled: pooled}
}

func TestInsertGetListSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	if _, err := s.Insert(ctx, row("a", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, row("a", false)); !errdefs.IsConflict(err) && !isAlreadyExists(err) {
		t.Fatalf("duplicate insert: %v", err)
	}
	if _, err := s.Insert(ctx, row("p", true)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Limits.MemoryBytes != 256<<20 || got.Env[0] != "A=1" || got.State != StateRunning || got.Created.IsZero() {
		t.Fatalf("round trip: %+v", got)
	}
	if _, err := s.Get(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	tenant, pooled := "default", true
	l, _ := s.List(ctx, Filter{Tenant: &tenant})
	if len(l) != 1 || l[0].ID != "a" {
		t.Fatalf("list by tenant: %+v", l)
	}
	l, _ = s.List(ctx, Filter{Pooled: &pooled})
	if len(l) != 1 || l[0].ID != "p" {
		t.Fatalf("list pooled: %+v", l)
	}
}

func isAlreadyExists(err error) bool { return errdefs.HTTPStatus(err) == 409 }

func TestSetStateIsConditional(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	s.Insert(ctx, row("a", false))
	if _, err := s.SetState(ctx, "a", StateStopped, "killed", StateRunning); err != nil {
		t.Fatal(err)
	}
	cur, err := s.SetState(ctx, "a", StateCrashed, "lost", StateRunning)
	if errdefs.HTTPStatus(err) != 412 || cur.State != StateStopped {
		t.Fatalf("conditional set from wrong state: %v %+v", err, cur)
	}
	if _, err := s.SetState(ctx, "a", StateDestroyed, "rm"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.List(ctx, Filter{}); len(l) != 0 {
		t.Fatalf("destroyed listed: %+v", l)
	}
	if l, _ := s.List(ctx, Filter{States: []State{StateDestroyed}}); len(l) != 1 || l[0].Reason != "rm" {
		t.Fatalf("destroyed history: %+v", l)
	}
}

func TestClaimOnlyOnce(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	pooledAt, _ := s.Insert(ctx, row("p", true))
	s.clock.(*clock.Fake).Advance(time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Claim(ctx, "p", "default", sandbox.Limits{}, []string{"X=1"}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d claims won", wins)
	}
	got, _ := s.Get(ctx, "p")
	if got.Pooled || !got.FromPool || got.Tenant != "default" || got.Env[0] != "X=1" || !got.Created.Equal(pooledAt.Created.Add(time.Minute)) {
		t.Fatalf("claimed row: %+v", got)
	}
}
