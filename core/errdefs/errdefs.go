// Package errdefs defines the kinds of error used everywhere in Amber.
//
// Code wraps one of the sentinel kinds with context:
//
//	return fmt.Errorf("append %s: %w", stream, errdefs.ErrConflict)
//
// or builds a new one with the helpers (errdefs.Conflictf). Callers test the
// kind with errors.Is or the Is* helpers. Kinds are mapped to HTTP status codes
// only at the server edge (see HTTPStatus).
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
)

// The kinds. Each is a sentinel; wrap it, never compare strings.
var (
	// ErrNotFound: the resource does not exist (or is not visible to the caller).
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a create named a resource that exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the request is malformed; retrying it unchanged fails again.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrConflict: the request raced with another writer (wrong expected position,
	// a reused id with different content, a lease held by someone else).
	ErrConflict = errors.New("conflict")
	// ErrFenced: the caller's lease epoch is older than the current one; the
	// caller must stop writing.
	ErrFenced = errors.New("fenced")
	// ErrCompacted: the requested position was truncated away.
	ErrCompacted = errors.New("compacted")
	// ErrUnavailable: a dependency is down or overloaded; retrying later may work.
	ErrUnavailable = errors.New("unavailable")
	// ErrDataLoss: stored data is corrupt or missing; it is never returned as valid.
	ErrDataLoss = errors.New("data loss")
	// ErrPermissionDenied: the caller is authenticated but not allowed.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnauthenticated: no valid credentials.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrResourceExhausted: a quota or limit was reached.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrFailedPrecondition: the system is not in a state that allows the call.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrNotImplemented: the driver or backend lacks the capability.
	ErrNotImplemented = errors.New("not implemented")
	// ErrTooLarge: a request (body, upload, header) is over a size limit;
	// the message names the limit. Retrying the same request cannot work,
	// unlike ErrResourceExhausted.
	ErrTooLarge = errors.New("too large")
)

func wrapf(kind error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), kind)
}

// NotFoundf returns an ErrNotFound with a message.
func NotFoundf(format string, args ...any) error { return wrapf(ErrNotFound, format, args...) }

// AlreadyExistsf returns an ErrAlreadyExists with a message.
func AlreadyExistsf(format string, args ...any) error {
	return wrapf(ErrAlreadyExists, format, args...)
}

// InvalidArgumentf returns an ErrInvalidArgument with a message.
func InvalidArgumentf(format string, args ...any) error {
	return wrapf(ErrInvalidArgument, format, args...)
}

// Conflictf returns an ErrConflict with a message.
func Conflictf(format string, args ...any) error { return wrapf(ErrConflict, format, args...) }

// Fencedf returns an ErrFenced with a message.
func Fencedf(format string, args ...any) error { return wrapf(ErrFenced, format, args...) }

// Compactedf returns an ErrCompacted with a message.
func Compactedf(format string, args ...any) error { return wrapf(ErrCompacted, format, args...) }

// Unavailablef returns an ErrUnavailable with a message.
func Unavailablef(format string, args ...any) error { return wrapf(ErrUnavailable, format, args...) }

// DataLossf returns an ErrDataLoss with a message. The message names what is
// damaged (stream and position, chunk hash, file) so an operator can act.
func DataLossf(format string, args ...any) error { return wrapf(ErrDataLoss, format, args...) }

// PermissionDeniedf returns an ErrPermissionDenied with a message.
func PermissionDeniedf(format string, args ...any) error {
	return wrapf(ErrPermissionDenied, format, args...)
}

// ResourceExhaustedf returns an ErrResourceExhausted with a message.
func ResourceExhaustedf(format string, args ...any) error {
	return wrapf(ErrResourceExhausted, format, args...)
}

// FailedPreconditionf returns an ErrFailedPrecondition with a message.
func FailedPreconditionf(format string, args ...any) error {
	return wrapf(ErrFailedPrecondition, format, args...)
}

// NotImplementedf returns an ErrNotImplemented with a message.
func NotImplementedf(format string, args ...any) error {
	return wrapf(ErrNotImplemented, format, args...)
}

// TooLargef returns an ErrTooLarge with a message.
func TooLargef(format string, args ...any) error { return wrapf(ErrTooLarge, format, args...) }

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is of kind ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsFenced reports whether err is of kind ErrFenced.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// IsDataLoss reports whether err is of kind ErrDataLoss.
func IsDataLoss(err error) bool { return errors.Is(err, ErrDataLoss) }

// IsInvalidArgument reports whether err is of kind ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsCompacted reports whether err is of kind ErrCompacted.
func IsCompacted(err error) bool { return errors.Is(err, ErrCompacted) }

// IsUnavailable reports whether err is of kind ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

var statusByKind = []struct {
	kind   error
	status int
}{
	{ErrNotFound, http.StatusNotFound},
	{ErrAlreadyExists, http.StatusConflict},
	{ErrInvalidArgument, http.StatusBadRequest},
	{ErrConflict, http.StatusConflict},
	{ErrFenced, http.StatusConflict},
	{ErrCompacted, http.StatusGone},
	{ErrUnavailable, http.StatusServiceUnavailable},
	{ErrDataLoss, http.StatusInternalServerError},
	{ErrPermissionDenied, http.StatusForbidden},
	{ErrUnauthenticated, http.StatusUnauthorized},
	{ErrResourceExhausted, http.StatusTooManyRequests},
	{ErrFailedPrecondition, http.StatusPreconditionFailed},
	{ErrNotImplemented, http.StatusNotImplemented},
	{ErrTooLarge, http.StatusRequestEntityTooLarge},
}

// HTTPStatus maps an error's kind to an HTTP status code (500 when it has none).
func HTTPStatus(err error) int {
	for _, s := range statusByKind {
		if errors.Is(err, s.kind) {
			return s.status
		}
	}
	if noSpace(err) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// noSpace reports whether err, of no kind, is a full disk (ENOSPC from
// any store or file under the call): unavailable for now — retried by
// clients as they retry a 503 (a full data dir frees up as checkpoints are
// collected, or when an operator adds room) — rather than an internal error.
func noSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) }

// IsNoSpace reports whether err is a full disk (ENOSPC from any store or
// file under the call): a passing condition, as ErrUnavailable is.
func IsNoSpace(err error) bool { return noSpace(err) }

// Kind returns the short name of err's kind ("not found", "conflict", …) or
// "internal" when it has none. It is the machine-readable code in API errors.
func Kind(err error) string {
	for _, s := range statusByKind {
		if errors.Is(err, s.kind) {
			return s.kind.Error()
		}
	}
	if noSpace(err) {
		return ErrUnavailable.Error()
	}
	return "internal"
}
