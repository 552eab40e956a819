package sqlmeta

import (
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/metadata/metatest"
)

// TestConformance runs core/metadata's suite on the current backend
// (TestMain runs the package on SQLite, then on PostgreSQL).
func TestConformance(t *testing.T) {
	metatest.Run(t, func(t *testing.T) metatest.Opener {
		spec := newSpec(t)
		return func(c clock.Clock) (metadata.Store, error) {
			s, err := Open(spec, Options{Clock: c})
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return s, nil
		}
	})
}
