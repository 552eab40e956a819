package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"
)

func TestKindsSurviveWrapping(t *testing.T) {
	cases := []struct {
		err    error
		kind   error
		status int
		name   string
	}{
		{NotFoundf("sandbox %s", "x"), ErrNotFound, http.StatusNotFound, "not found"},
		{Conflictf("stream s at %d", 3), ErrConflict, http.StatusConflict, "conflict"},
		{Fencedf("epoch 1 < 2"), ErrFenced, http.StatusConflict, "fenced"},
		{Compactedf("below 10"), ErrCompacted, http.StatusGone, "compacted"},
		{DataLossf("chunk abc"), ErrDataLoss, http.StatusInternalServerError, "data loss"},
		{InvalidArgumentf("bad"), ErrInvalidArgument, http.StatusBadRequest, "invalid argument"},
		{ResourceExhaustedf("quota"), ErrResourceExhausted, http.StatusTooManyRequests, "resource exhausted"},
		{Unavailablef("down"), ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
		{TooLargef("body over 8 MiB"), ErrTooLarge, http.StatusRequestEntityTooLarge, "too large"},
	}
	for _, c := range cases {
		wrapped := fmt.Errorf("outer: %w", c.err)
		if !errors.Is(wrapped, c.kind) {
			t.Errorf("%v: kind lost after wrapping", c.err)
		}
		if got := HTTPStatus(wrapped); got != c.status {
			t.Errorf("%v: status %d, want %d", c.err, got, c.status)
		}
		if got := Kind(wrapped); got != c.name {
			t.Errorf("%v: kind name %q, want %q", c.err, got, c.name)
		}
	}
	plain := errors.New("boom")
	if HTTPStatus(plain) != http.StatusInternalServerError || Kind(plain) != "internal" {
		t.Errorf("an error without a kind must map to 500/internal")
	}
	if IsNotFound(Conflictf("x")) || !IsDataLoss(DataLossf("x")) {
		t.Errorf("Is helpers confuse kinds")
	}
}

// TestNoSpaceIsUnavailable: a full disk under a call (ENOSPC, wrapped as
// stores wrap it) is a 503 "unavailable" that clients retry, not a 500;
// a kind given to it explicitly still wins; other errno values stay 500.
func TestNoSpaceIsUnavailable(t *testing.T) {
	full := fmt.Errorf("checkpoint sbx-1: write chunk: %w", &os.PathError{Op: "write", Path: "/data/chunks/x", Err: syscall.ENOSPC})
	if got := HTTPStatus(full); got != http.StatusServiceUnavailable || Kind(full) != "unavailable" {
		t.Fatalf("ENOSPC: status %d kind %q, want 503 unavailable", got, Kind(full))
	}
	if got := HTTPStatus(fmt.Errorf("%w: %w", ErrDataLoss, full)); got != http.StatusInternalServerError {
		t.Fatalf("data loss with ENOSPC under it: %d, want the kind's 500", got)
	}
	if got := HTTPStatus(&os.PathError{Op: "open", Path: "/x", Err: syscall.EIO}); got != http.StatusInternalServerError {
		t.Fatalf("EIO: %d, want 500", got)
	}
}
