// Package metatest is the conformance suite of metadata.Store: every
// backend (SQLite and PostgreSQL, stores/sqlmeta) runs Run against
// itself and must pass all of it.
package metatest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
)

// Opener opens the store of one subtest with clock c: the first call
// creates it empty (but for the operator's tenant, metadata.DefaultTenant),
// later calls open the same store again, as a restarted daemon would.
type Opener func(c clock.Clock) (metadata.Store, error)

// Run runs the suite. newStore returns, for each subtest, the Opener of a
// fresh store (a new file, a new schema); the backend removes it through
// t.Cleanup. The suite closes every store it opens.
func Run(t *testing.T, newStore func(t *testing.T) Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open Opener)
	}{
		{"InsertGetListSurvivesReopen", testInsertGetList},
		{"SetStateIsConditional", testSetStateIsConditional},
		{"ClaimOnlyOnce", testClaimOnlyOnce},
		{"MetadataAndExpiry", testMetadataAndExpiry},
		{"StatementsRoundTrip", testStatementsRoundTrip},
		{"CheckpointUploadPending", testCheckpointUploadPending},
		{"TenantsAndKeys", testTenantsAndKeys},
		{"Sessions", testSessions},
		{"NodeLeases", testNodeLeases},
		{"NodeLock", testNodeLock},
		{"FailoverPlan", testFailoverPlan},
		{"DrainedNodeStaysDrained", testDrainedNodeStaysDrained},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newStore(t))
		})
	}
}

// epoch is where the suite's fake clocks start.
var epoch = time.Unix(1700000000, 0)

// mustOpen opens the store with c and closes it when t ends.
func mustOpen(t *testing.T, open Opener, c clock.Clock) metadata.Store {
	t.Helper()
	s, err := open(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func row(id string, pooled bool) metadata.Sandbox {
	tenant := metadata.DefaultTenant
	if pooled {
		tenant = ""
	}
	return metadata.Sandbox{ID: id, Tenant: tenant, Template: "minimal", TemplateVersion: "v1", Driver: "gvisor",
		Limits: sandbox.Limits{MemoryBytes: 256 << 20}, Env: []string{"A=1"}, State: metadata.StateRunning, Pooled: pooled}
}

// hashOf is a key's or token's stored form: hex SHA-256.
func hashOf(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func isAlreadyExists(err error) bool { return errdefs.HTTPStatus(err) == 409 }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
