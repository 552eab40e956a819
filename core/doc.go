// Package core holds Amber's contracts: the sandbox driver (core/sandbox),
// the event log (core/eventlog), blobs (core/blob), the metadata store
// (core/metadata), errors (core/errdefs) and time (core/clock), each with
// its conformance suite (…test packages). The
// implementations live elsewhere (drivers/, stores/); the contracts know none
// of them.
//
// May import: nothing of Amber's outside core.
package core
