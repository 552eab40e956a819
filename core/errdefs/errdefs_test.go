package errdefs

import (
	"errors"
	"fmt"
	"net/http"
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
