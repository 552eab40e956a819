// Package edge is Amber's edge: the REST API server (internal/edge/server)
// and the API-only front server of many nodes (internal/edge/apiproxy). It
// speaks the api types to clients and the engine's and sessions' types inward.
//
// May import: api, core, lib, internal/engine, internal/session, internal/state, internal/egress/gateway, internal/obs.
package edge
