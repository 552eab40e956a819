package metadata

import (
	"time"
)

// Session is the metadata row of an agent session (internal/session). The
// session's log stream "session/<id>" is the truth; this row is an index
// for listing, ownership (tenant) and waking at start: Status and SandboxID
// are copies of what the log says, written after the log.
type Session struct {
	ID     string
	Tenant string
	// Definition is the session's agent definition as JSON (also the
	// payload of its first log event).
	Definition string
	Status     string
	Reason     string
	SandboxID  string
	Created    time.Time
	Updated    time.Time
}
