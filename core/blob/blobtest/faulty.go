package blobtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"sync"

	"github.com/amber-run/amber/core/blob"
)

// Op names a blob.Store method, for Fault.
type Op string

// The operations Faulty can fail.
const (
	OpPut         Op = "put"
	OpPutIfAbsent Op = "putifabsent"
	OpGet         Op = "get"
	OpStat        Op = "stat"
	OpDelete      Op = "delete"
	OpList        Op = "list"
)

// ErrInjected is the error Faulty returns for an injected failure.
var ErrInjected = errors.New("blobtest: injected failure")

// Fault decides, before each call, whether it fails: a non-nil error is
// returned instead of calling the wrapped store (so a failed write stores
// nothing, like a process killed before the write). key is the key, or the
// prefix for OpList.
type Fault func(op Op, key string) error

// Faulty wraps a blob.Store and fails the calls its Fault picks. It is safe
// for concurrent use; SetFault may be called at any time.
type Faulty struct {
	inner blob.Store
	mu    sync.Mutex
	fault Fault
}

var _ blob.Store = (*Faulty)(nil)

// NewFaulty wraps s; fault may be nil (no failures).
func NewFaulty(s blob.Store, fault Fault) *Faulty { return &Faulty{inner: s, fault: fault} }

// SetFault replaces the fault (nil: no failures).
func (f *Faulty) SetFault(fault Fault) {
	f.mu.Lock()
	f.fault = fault
	f.mu.Unlock()
}

func (f *Faulty) check(op Op, key string) error {
	f.mu.Lock()
	fault := f.fault
	f.mu.Unlock()
	if fault == nil {
		return nil
	}
	return fault(op, key)
}

// Put implements blob.Store.
func (f *Faulty) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := f.check(OpPut, key); err != nil {
		return err
	}
	return f.inner.Put(ctx, key, r, size)
}

// PutIfAbsent implements blob.Store.
func (f *Faulty) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := f.check(OpPutIfAbsent, key); err != nil {
		return err
	}
	return f.inner.PutIfAbsent(ctx, key, r, size)
}

// Get implements blob.Store.
func (f *Faulty) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := f.check(OpGet, key); err != nil {
		return nil, err
	}
	return f.inner.Get(ctx, key)
}

// GetRange implements blob.RangeGetter: a fault on OpGet fails it too.
func (f *Faulty) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := f.check(OpGet, key); err != nil {
		return nil, err
	}
	return blob.OpenRange(ctx, f.inner, key, off, n)
}

// Stat implements blob.Store.
func (f *Faulty) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := f.check(OpStat, key); err != nil {
		return blob.Info{}, err
	}
	return f.inner.Stat(ctx, key)
}

// Delete implements blob.Store.
func (f *Faulty) Delete(ctx context.Context, key string) error {
	if err := f.check(OpDelete, key); err != nil {
		return err
	}
	return f.inner.Delete(ctx, key)
}

// List implements blob.Store.
func (f *Faulty) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	if err := f.check(OpList, prefix); err != nil {
		return func(yield func(blob.Info, error) bool) { yield(blob.Info{}, err) }
	}
	return f.inner.List(ctx, prefix)
}

// CrashAfter returns a Fault that lets n calls matching match through and
// then fails every call of any kind, for ever: the store behaves as if the
// process using it was killed right after its n-th matching call (nothing it
// tries afterwards, clean-up included, reaches the store).
func CrashAfter(n int, match func(op Op, key string) bool) Fault {
	var mu sync.Mutex
	seen, crashed := 0, false
	return func(op Op, key string) error {
		mu.Lock()
		defer mu.Unlock()
		if crashed {
			return fmt.Errorf("%s %s: %w (after crash)", op, key, ErrInjected)
		}
		if match(op, key) {
			if seen == n {
				crashed = true
				return fmt.Errorf("%s %s: %w (crash)", op, key, ErrInjected)
			}
			seen++
		}
		return nil
	}
}

// IsWrite matches the calls that change the store, for CrashAfter.
func IsWrite(ops ...Op) func(op Op, key string) bool {
	if len(ops) == 0 {
		ops = []Op{OpPut, OpPutIfAbsent, OpDelete}
	}
	return func(op Op, _ string) bool { return slices.Contains(ops, op) }
}
