package miniotest_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/stores/s3/miniotest"
)

// Without the binary the S3 tests fail (never skip) and say how to get it.
func TestMissingBinary(t *testing.T) {
	for _, bin := range []string{filepath.Join(t.TempDir(), "minio"), t.TempDir()} {
		err := miniotest.CheckBinary(bin)
		if err == nil || !strings.Contains(err.Error(), "make setup-test") {
			t.Fatalf("CheckBinary(%s) = %v, want an error naming make setup-test", bin, err)
		}
	}
	t.Setenv("AMBER_MINIO_BIN", "/x/minio")
	if miniotest.Binary() != "/x/minio" {
		t.Fatal("AMBER_MINIO_BIN ignored")
	}
	t.Setenv("AMBER_MINIO_BIN", "")
	t.Setenv("AMBER_CACHE", "/c")
	if miniotest.Binary() != "/c/bin/minio" {
		t.Fatalf("Binary() = %s", miniotest.Binary())
	}
}
