// Package edge is Amber's edge: the REST API server (internal/edge/server)
// and the API-only front server of many nodes (internal/edge/apiproxy). It
// speaks the api types to clients and the engine's and sessions' types inward.
// It reads no store itself but through the contracts of core/ (API keys by
// hash to authenticate, idempotent answers): tenants, keys and nodes are
// administered by engine.Tenancy, and neither the metadata store's backend
// (stores/) nor its domain package (internal/state/meta) is the edge's to
// import.
//
// May import: api, core, lib, internal/engine, internal/session, internal/state/audit, internal/state/secretstore, internal/state/templatestore, internal/egress/gateway, internal/obs.
package edge
