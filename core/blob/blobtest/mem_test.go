package blobtest_test

import (
	"testing"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
)

func TestMemConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return blobtest.NewMem() })
}
