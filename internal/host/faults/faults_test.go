package faults

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/eventlog/logtest"
	"github.com/amber-run/amber/lib/failpoint"
	"github.com/amber-run/amber/stores/sqlite"
)

// Unarmed, the wrappers are the stores: both pass their conformance suites.
func TestUnarmedWrappersConform(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return Blobs(blobtest.NewMem(), failpoint.New()) })
	logtest.Run(t, func(t *testing.T, clk clock.Clock) eventlog.Store {
		s, err := sqlite.Open(filepath.Join(t.TempDir(), "ev.db"), sqlite.Options{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		l := Log(s, failpoint.New())
		if _, ok := l.(eventlog.Notifier); !ok {
			t.Fatal("the wrapper hides the store's Notifier")
		}
		return l
	}, logtest.Options{})
}

// An armed point fails the operation before the store is touched, for as
// long as its window lasts; every evaluation is counted.
func TestArmedPointsFailBeforeTheStore(t *testing.T) {
	ctx := context.Background()
	full := errors.New("no space left on device")
	fps := failpoint.New()
	fps.ArmEach(BlobWrite, 2, failpoint.Window(time.Hour, func(string) error { return full }))
	mem := blobtest.NewMem()
	b := Blobs(mem, fps)
	if err := b.Put(ctx, "a", bytes.NewReader([]byte("1")), 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, "b", bytes.NewReader([]byte("2")), 1); !errors.Is(err, full) {
		t.Fatalf("2nd write: %v, want the injected error", err)
	}
	if _, err := mem.Stat(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("the failed Put reached the store: %v", err)
	}
	if err := b.Delete(ctx, "a"); !errors.Is(err, full) {
		t.Fatalf("delete in the window: %v", err)
	}
	if _, err := b.Stat(ctx, "a"); err != nil { // reads are another point
		t.Fatalf("read: %v", err)
	}
	if fps.Hits(BlobWrite) != 3 || fps.Hits(BlobRead) != 1 {
		t.Fatalf("hits %v", fps.Counts())
	}

	s, err := sqlite.Open(filepath.Join(t.TempDir(), "ev.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fps.ArmEach(EventlogAppend, 1, failpoint.Window(50*time.Millisecond, func(string) error { return errdefs.Unavailablef("injected") }))
	l := Log(s, fps)
	ev := eventlog.Event{Tenant: "t", ID: "e1", Type: "x", Version: 1, Payload: []byte(`{}`)}
	if _, err := l.Append(ctx, "s/1", 0, 0, ev); !errdefs.IsUnavailable(err) {
		t.Fatalf("append in the window: %v", err)
	}
	if b, _ := s.Bounds(ctx, "s/1"); b.Head != 0 {
		t.Fatalf("the refused append landed: head %d", b.Head)
	}
	time.Sleep(80 * time.Millisecond)
	if _, err := l.Append(ctx, "s/1", 0, 0, ev); err != nil {
		t.Fatalf("append after the window: %v", err)
	}
}
