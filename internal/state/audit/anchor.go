package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Head is a stream's anchored head: the position of its last record as
// this process appended it, and that record's hash.
type Head struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Anchor keeps each tenant's head outside the event log's store (see the
// package comment). Implementations are safe for concurrent use.
type Anchor interface {
	// Load returns tenant's anchored head; the zero Head if none.
	Load(tenant string) (Head, error)
	// Advance anchors h as tenant's head, durably before it returns,
	// unless the anchor already holds a later one.
	Advance(tenant string, h Head) error
}

// FileAnchor is an Anchor in one JSON file (DATA_DIR/audit.head), mode
// 0600, replaced atomically (temp file, fsync, rename, fsync dir) on each
// Advance.
type FileAnchor struct {
	path  string
	mu    sync.Mutex
	heads map[string]Head
}

// OpenFileAnchor reads the anchor at path (a missing file is an empty
// anchor; a damaged one is an error, not a reset).
func OpenFileAnchor(path string) (*FileAnchor, error) {
	a := &FileAnchor{path: path, heads: map[string]Head{}}
	b, err := os.ReadFile(path)
	switch {
	case os.IsNotExist(err):
		return a, nil
	case err != nil:
		return nil, fmt.Errorf("audit anchor: %w", err)
	}
	if err := json.Unmarshal(b, &a.heads); err != nil {
		return nil, fmt.Errorf("audit anchor %s does not decode (%v): restore it from a backup, or move it away to stop checking the trails' heads", path, err)
	}
	return a, nil
}

// Load implements Anchor.
func (a *FileAnchor) Load(tenant string) (Head, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.heads[tenant], nil
}

// Advance implements Anchor.
func (a *FileAnchor) Advance(tenant string, h Head) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, had := a.heads[tenant]
	if h.Seq <= old.Seq {
		return nil
	}
	a.heads[tenant] = h
	b, _ := json.Marshal(a.heads)
	if err := writeAtomic(a.path, b); err != nil {
		if had {
			a.heads[tenant] = old
		} else {
			delete(a.heads, tenant)
		}
		return fmt.Errorf("audit anchor: %w", err)
	}
	return nil
}

// writeAtomic writes data to path (0600) so that a reader sees the old
// content or the new, and the new survives power loss once it returns.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
