package sqlmeta

import (
	"context"
	"errors"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

func TestSessionsRows(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	for _, se := range []Session{
		{ID: "ses-a", Tenant: "acme", Definition: `{"x":1}`, Status: "idle"},
		{ID: "ses-b", Tenant: "globex", Definition: `{}`, Status: "running"},
	} {
		if _, err := s.InsertSession(ctx, se); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.InsertSession(ctx, Session{ID: "ses-a", Tenant: "acme", Status: "idle"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second insert of ses-a: %v", err)
	}
	if err := s.SetSessionStatus(ctx, "ses-a", "running", "user message"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSessionSandbox(ctx, "ses-a", "sbx-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSessionStatus(ctx, "ses-nope", "running", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("status of a missing session: %v", err)
	}
	s.Close()
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.GetSession(ctx, "ses-a")
	if err != nil || got.Tenant != "acme" || got.Status != "running" || got.Reason != "user message" || got.SandboxID != "sbx-1" || got.Definition != `{"x":1}` {
		t.Fatalf("ses-a after reopen: %+v %v", got, err)
	}
	l, err := s2.ListSessions(ctx, "acme")
	if err != nil || len(l) != 1 || l[0].ID != "ses-a" {
		t.Fatalf("acme's sessions: %+v %v", l, err)
	}
	l, err = s2.ListSessions(ctx, "", "running")
	if err != nil || len(l) != 2 {
		t.Fatalf("running sessions: %+v %v", l, err)
	}
	if _, err := s2.GetSession(ctx, "ses-c"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing session: %v", err)
	}
}
