package s3_test

import (
	"context"
	"testing"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/stores/s3"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

func TestConformance(t *testing.T) {
	srv := miniotest.Start(t)
	blobtest.Run(t, func(t *testing.T) blob.Store {
		cfg := srv.Config()
		cfg.ListPageSize = 5 // exercise paging
		s, err := s3.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// Stores with different prefixes share a bucket without seeing each other.
func TestConformanceWithPrefix(t *testing.T) {
	srv := miniotest.Start(t)
	base := srv.Config()
	n := 0
	blobtest.Run(t, func(t *testing.T) blob.Store {
		cfg := base
		n++
		cfg.Prefix = "store" + string(rune('a'+n)) + "/"
		cfg.ListPageSize = 4
		s, err := s3.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		// A neighbour's object under the bucket must never show up.
		other := base
		other.Prefix = cfg.Prefix[:len(cfg.Prefix)-1] + "x/"
		o, err := s3.Open(context.Background(), other)
		if err != nil {
			t.Fatal(err)
		}
		if err := blob.PutBytes(context.Background(), o, "t/a/zz", []byte("neighbour")); err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestOpenMissingBucket(t *testing.T) {
	srv := miniotest.Start(t)
	cfg := srv.Config()
	cfg.CreateBucket = false
	if _, err := s3.Open(context.Background(), cfg); !errdefs.IsNotFound(err) {
		t.Fatalf("open missing bucket: got %v, want not found", err)
	}
	cfg.Prefix = "no-slash"
	if _, err := s3.Open(context.Background(), cfg); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("open with bad prefix: got %v, want invalid argument", err)
	}
}

func TestUnreachable(t *testing.T) {
	_, err := s3.Open(context.Background(), s3.Config{
		Endpoint: "127.0.0.1:1", Bucket: "bucket", AccessKey: "a", SecretKey: "b",
	})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("open unreachable: got %v, want unavailable", err)
	}
}
