package metadata

import (
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Idempotent is a recorded answer to a create call made with an
// Idempotency-Key: a retry of the same request gets it again instead of a
// second sandbox, checkpoint or process.
type Idempotent struct {
	Tenant, Key string
	// RequestHash identifies the request (method, path, body): a key
	// reused for another request is refused.
	RequestHash string
	// Done is false while the first call runs.
	Done        bool
	Status      int
	ContentType string
	Body        []byte
	Created     time.Time
}

// ValidIdempotencyKey checks an Idempotency-Key header value.
func ValidIdempotencyKey(k string) error {
	if k == "" || len(k) > 200 || strings.ContainsAny(k, "\x00\r\n") {
		return errdefs.InvalidArgumentf("Idempotency-Key: 1 to 200 printable characters")
	}
	return nil
}
