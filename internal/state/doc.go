// Package state holds Amber's persistent state beside the event log: the
// metadata store (internal/state/meta), the chunk store of checkpoints and
// templates (internal/state/chunkstore, internal/state/templatestore), sealed
// secrets (internal/state/secretstore) and the audit trail
// (internal/state/audit). The secret store implements the egress gateway's
// Secrets and TLSTerminator, hence its import outside state. The metadata
// store is the contract of core/metadata; none of state knows its backend
// (stores/sqlmeta), which cmd/amber picks and opens.
//
// May import: core, lib, internal/egress/gateway.
package state
