// Package blob is the contract of Amber's object storage: a flat namespace of
// immutable-per-write byte objects addressed by key. Checkpoint chunks,
// manifests and commit pointers live here (see internal/state/chunkstore).
//
// # Vocabulary
//
// A key names an object. It is a "/"-separated path of segments; each segment
// starts with an ASCII letter or digit and continues with letters, digits,
// '.', '_', '-' or '='; no segment is "." or ".."; the key has no leading or
// trailing "/" and no empty segment; a segment is at most 255 bytes and a key
// at most 1024 (see ValidateKey). A malformed key fails every call with
// errdefs.ErrInvalidArgument before anything is touched.
//
// A prefix selects keys for List by plain string prefix ("tenants/a" matches
// "tenants/a/x" and "tenants/ab/y"). The empty prefix selects every key.
//
// Keys are a path hierarchy, not arbitrary strings: a store may refuse
// (errdefs.ErrConflict) to hold both "a/b" and "a/b/c", because a filesystem
// (and MinIO) cannot hold a file and a directory under one name. Callers
// design their key layouts so that no object key is a path prefix of another.
//
// # Writing
//
// Put stores the size bytes read from r under key and returns only once the
// object is durable: it survives a crash or power loss of the store. An
// object is visible whole or not at all: a Put that fails for any reason (a
// reader error, a short or long reader, a cancelled context, a crash of the
// writer) leaves the previous object — or no object — in place, never a
// prefix of the new one. Put overwrites an existing object atomically:
// concurrent readers see either the old or the new bytes.
//
// PutIfAbsent is Put that fails with errdefs.ErrAlreadyExists, changing
// nothing, when key exists; of many concurrent PutIfAbsent calls on one key
// exactly one succeeds. It is what commit pointers are written with.
//
// Delete removes an object durably; deleting a missing key succeeds.
//
// # Reading
//
// Get returns the object's bytes; a reader that was opened keeps reading the
// version it opened even if the key is overwritten or deleted meanwhile
// (localfs), or fails rather than mixing versions (S3). Stat returns an
// object's size and modification time. Both return errdefs.ErrNotFound for a
// missing key. List yields the objects under a prefix in lexicographic key
// order; it pages through large listings itself. Objects written or deleted
// while a listing runs may or may not appear.
//
// Errors other than the kinds above are wrapped errdefs.ErrUnavailable when
// the backend is unreachable or overloaded; callers may retry those.
//
// # Implementations
//
// stores/localfs (the default) and stores/s3 (S3-compatible, through
// minio-go). Both pass the conformance suite in core/blob/blobtest. A Store is
// safe for concurrent use.
package blob

import (
	"context"
	"io"
	"iter"
	"time"
)

// Info describes a stored object.
type Info struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Store is an object store backend (see the package comment).
type Store interface {
	// Put stores exactly size bytes from r under key, durably and atomically.
	// r must yield exactly size bytes: a shorter or longer reader fails with
	// errdefs.ErrInvalidArgument and stores nothing. size < 0 means "read r
	// to EOF".
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// PutIfAbsent is Put that fails with errdefs.ErrAlreadyExists when key
	// exists.
	PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens the object for reading. The caller closes the reader.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat returns the object's Info.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the object; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List yields the objects whose key starts with prefix, in lexicographic
	// key order. An error ends the iteration: it is yielded once with a zero
	// Info.
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
}
