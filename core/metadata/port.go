package metadata

import (
	"time"
)

// Exposure is a sandbox port reachable through the daemon's proxy. Only the
// SHA-256 of its token is kept (HashKey).
type Exposure struct {
	SandboxID string
	Port      int
	Tenant    string
	TokenHash string
	Created   time.Time
}
