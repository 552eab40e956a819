// Package state holds Amber's persistent state beside the event log: the
// metadata store (internal/state/meta), the chunk store of checkpoints and
// templates (internal/state/chunkstore, internal/state/templatestore), sealed
// secrets (internal/state/secretstore) and the audit trail
// (internal/state/audit). The secret store implements the egress gateway's
// Secrets and TLSTerminator, hence its import outside state; the metadata
// store's domain layer (internal/state/meta) opens its SQL backend
// (stores/sqlmeta), hence that one.
//
// May import: core, lib, internal/egress/gateway, stores/sqlmeta.
package state
