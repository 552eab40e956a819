package sqlmeta

import "github.com/amber-run/amber/core/metadata"

// The tests' short names for the contract's helpers (core/metadata).
var (
	HashKey   = metadata.HashKey
	AllScopes = metadata.AllScopes
)

const OperatorKeyName = metadata.OperatorKeyName
