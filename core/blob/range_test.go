package blob_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
)

// noRange is a store without GetRange: ReadRange skips to the range.
type noRange struct{ blob.Store }

func TestReadRangeWithoutGetRange(t *testing.T) {
	ctx := context.Background()
	s := noRange{blobtest.NewMem()}
	data := bytes.Repeat([]byte("0123456789"), 1000)
	if err := blob.PutBytes(ctx, s, "o", data); err != nil {
		t.Fatal(err)
	}
	got, err := blob.ReadRange(ctx, s, "o", 1234, 567)
	if err != nil || !bytes.Equal(got, data[1234:1234+567]) {
		t.Fatalf("range: %v", err)
	}
	if _, err := blob.ReadRange(ctx, s, "o", 9990, 11); !errdefs.IsDataLoss(err) {
		t.Fatalf("past the end: %v", err)
	}
	if _, err := blob.ReadRange(ctx, s, "o", 20000, 1); !errdefs.IsDataLoss(err) {
		t.Fatalf("offset past the end: %v", err)
	}
	if _, err := blob.ReadRange(ctx, s, "o", -1, 1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative offset: %v", err)
	}
}
