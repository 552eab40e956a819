package metadata

import (
	"time"
)

// SealedSecret is a secret as stored: its value sealed, its bindings clear.
type SealedSecret struct {
	Tenant, Name string
	Sealed       []byte
	Hosts        []string
	Updated      time.Time
}
