package blob

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/amber-run/amber/core/errdefs"
)

// Limits of a key (see the package comment).
const (
	MaxKeyLen     = 1024
	MaxSegmentLen = 255
)

// ValidateKey reports whether key is a well-formed object key, as an
// errdefs.ErrInvalidArgument naming what is wrong.
func ValidateKey(key string) error {
	if key == "" {
		return errdefs.InvalidArgumentf("blob key is empty")
	}
	if len(key) > MaxKeyLen {
		return errdefs.InvalidArgumentf("blob key %.40q…: longer than %d bytes", key, MaxKeyLen)
	}
	start := 0
	for i := 0; i <= len(key); i++ {
		if i < len(key) && key[i] != '/' {
			continue
		}
		if err := validateSegment(key, key[start:i]); err != nil {
			return err
		}
		start = i + 1
	}
	return nil
}

func validateSegment(key, seg string) error {
	switch {
	case seg == "":
		return errdefs.InvalidArgumentf("blob key %q: empty segment (leading, trailing or double '/')", key)
	case len(seg) > MaxSegmentLen:
		return errdefs.InvalidArgumentf("blob key %q: segment longer than %d bytes", key, MaxSegmentLen)
	case !isAlnum(seg[0]):
		return errdefs.InvalidArgumentf("blob key %q: segment %q must start with a letter or digit", key, seg)
	}
	for i := 1; i < len(seg); i++ {
		if !isKeyChar(seg[i]) {
			return errdefs.InvalidArgumentf("blob key %q: character %q not allowed", key, seg[i])
		}
	}
	return nil
}

// ValidatePrefix reports whether prefix is usable with List: empty, or a
// string that some valid key could start with.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxKeyLen {
		return errdefs.InvalidArgumentf("blob prefix %.40q…: longer than %d bytes", prefix, MaxKeyLen)
	}
	// A prefix is valid when completing it with one letter gives a valid key
	// ("a/" → "a/x", "a/b" → "a/bx"); this rejects "/x", "a//", "../".
	probe := prefix + "x"
	if prefix[len(prefix)-1] != '/' && isKeyChar(prefix[len(prefix)-1]) {
		probe = prefix
	}
	if err := ValidateKey(probe); err != nil {
		return errdefs.InvalidArgumentf("blob prefix %q: %v", prefix, err)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isKeyChar(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '-' || c == '='
}

// PutBytes stores b under key with s.Put.
func PutBytes(ctx context.Context, s Store, key string, b []byte) error {
	return s.Put(ctx, key, bytes.NewReader(b), int64(len(b)))
}

// ReadAll returns the whole object under key, failing with
// errdefs.ErrResourceExhausted when it is larger than limit bytes.
func ReadAll(ctx context.Context, s Store, key string, limit int64) ([]byte, error) {
	return ReadAllSized(ctx, s, key, limit, 0)
}

// ReadAllSized is ReadAll into a buffer made for an object of about
// sizeHint bytes at once, instead of one grown (copied and cleared again)
// from 512 bytes: a restore reads hundreds of chunks of half a MiB.
func ReadAllSized(ctx context.Context, s Store, key string, limit, sizeHint int64) ([]byte, error) {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var b []byte
	if sizeHint > 0 && sizeHint <= limit {
		// bytes.Buffer reads into the room it has, and grows only when
		// less than bytes.MinRead is left: the hint's slack.
		buf := bytes.NewBuffer(make([]byte, 0, sizeHint+bytes.MinRead))
		_, err = buf.ReadFrom(io.LimitReader(rc, limit+1))
		b = buf.Bytes()
	} else {
		b, err = io.ReadAll(io.LimitReader(rc, limit+1))
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(b)) > limit {
		return nil, errdefs.ResourceExhaustedf("read %s: larger than %d bytes", key, limit)
	}
	return b, nil
}

// RangeGetter is a Store that reads part of an object. A chunk store packs
// many small objects into one large one and reads back only the runs a
// restore needs: one request instead of one per small object.
type RangeGetter interface {
	// GetRange opens n bytes of the object from offset off. An object
	// shorter than off+n yields fewer bytes (ReadRange reports that).
	GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
}

// OpenRange opens n bytes of the object under key from offset off, with s's
// GetRange when it has one and by skipping otherwise. An object shorter than
// the range yields fewer bytes (ReadRange reports that).
func OpenRange(ctx context.Context, s Store, key string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 {
		return nil, errdefs.InvalidArgumentf("read %s: bad range %d+%d", key, off, n)
	}
	if rg, ok := s.(RangeGetter); ok {
		return rg.GetRange(ctx, key, off, n)
	}
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, rc, off); err != nil && err != io.EOF {
		rc.Close()
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, n), rc}, nil
}

// ReadRange returns exactly n bytes of the object under key from offset
// off (OpenRange). An object too short for the range is
// errdefs.ErrDataLoss: its bytes are not there.
func ReadRange(ctx context.Context, s Store, key string, off, n int64) ([]byte, error) {
	rc, err := OpenRange(ctx, s, key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(rc, b); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, errdefs.DataLossf("read %s: %d bytes from %d: the object is shorter", key, n, off)
		}
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return b, nil
}
