package blobtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// Mem is an in-memory blob.Store for unit tests and benchmarks. It passes
// the conformance suite; "durable" means "until the process exits".
type Mem struct {
	mu   sync.RWMutex
	objs map[string]memObj
}

type memObj struct {
	data []byte
	mod  time.Time
}

var _ blob.Store = (*Mem)(nil)

// NewMem returns an empty Mem.
func NewMem() *Mem { return &Mem{objs: map[string]memObj{}} }

func (m *Mem) read(ctx context.Context, key string, r io.Reader, size int64) ([]byte, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	src := r
	if size >= 0 {
		src = io.LimitReader(r, size+1)
	}
	var buf bytes.Buffer
	if size > 0 {
		buf.Grow(int(size))
	}
	if _, err := io.Copy(&buf, src); err != nil {
		return nil, fmt.Errorf("put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("put %s: %w", key, err)
	}
	if size >= 0 && int64(buf.Len()) != size {
		return nil, errdefs.InvalidArgumentf("put %s: reader gave %d bytes (or more), want %d", key, buf.Len(), size)
	}
	return buf.Bytes(), nil
}

// Put implements blob.Store.
func (m *Mem) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	b, err := m.read(ctx, key, r, size)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.objs[key] = memObj{b, time.Now()}
	m.mu.Unlock()
	return nil
}

// PutIfAbsent implements blob.Store.
func (m *Mem) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	b, err := m.read(ctx, key, r, size)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[key]; ok {
		return errdefs.AlreadyExistsf("put %s", key)
	}
	m.objs[key] = memObj{b, time.Now()}
	return nil
}

// Get implements blob.Store.
func (m *Mem) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	o, err := m.lookup(key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(o.data)), nil
}

// GetRange implements blob.RangeGetter.
func (m *Mem) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	o, err := m.lookup(key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(io.NewSectionReader(bytes.NewReader(o.data), off, n)), nil
}

func (m *Mem) lookup(key string) (memObj, error) {
	if err := blob.ValidateKey(key); err != nil {
		return memObj{}, err
	}
	m.mu.RLock()
	o, ok := m.objs[key]
	m.mu.RUnlock()
	if !ok {
		return memObj{}, errdefs.NotFoundf("get %s", key)
	}
	return o, nil
}

// Stat implements blob.Store.
func (m *Mem) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	m.mu.RLock()
	o, ok := m.objs[key]
	m.mu.RUnlock()
	if !ok {
		return blob.Info{}, errdefs.NotFoundf("stat %s", key)
	}
	return blob.Info{Key: key, Size: int64(len(o.data)), ModTime: o.mod}, nil
}

// Delete implements blob.Store.
func (m *Mem) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.objs, key)
	m.mu.Unlock()
	return nil
}

// List implements blob.Store (over a snapshot of the keys).
func (m *Mem) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if err := blob.ValidatePrefix(prefix); err != nil {
			yield(blob.Info{}, err)
			return
		}
		m.mu.RLock()
		var infos []blob.Info
		for k, o := range m.objs {
			if strings.HasPrefix(k, prefix) {
				infos = append(infos, blob.Info{Key: k, Size: int64(len(o.data)), ModTime: o.mod})
			}
		}
		m.mu.RUnlock()
		slices.SortFunc(infos, func(a, b blob.Info) int { return strings.Compare(a.Key, b.Key) })
		for _, info := range infos {
			if !yield(info, nil) {
				return
			}
		}
	}
}
