// Package session is the agent harness: a session's log is the truth of its
// conversation and progress; the harness replays it, calls the model, runs
// tools in the session's sandbox through the engine, and keeps the recovery
// policy (strict or fast) of each step.
//
// May import: core, lib, internal/engine, internal/state/meta, internal/egress/gateway, internal/obs/logging.
package session
