package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/amber-run/amber/internal/meta"
)

// ensureAdminKey makes sure DATA_DIR/admin.key holds a key the daemon
// accepts: the operator's key, named "admin", of tenant "default", with
// every scope (admin included: it creates tenants and their keys):
//
//   - no file: a new random key is written (0600; temp file, fsync,
//     rename, fsync dir) and its hash replaces any previous admin key;
//   - a file: its hash is (re)registered, so a lost meta.db does not lock
//     the operator out.
//
// Only the key's SHA-256 is stored in the metadata store.
//
// On shared stores (shared), a node without the file does not replace an
// operator key another node registered (that would lock the other nodes'
// admin.key out): it fails, asking for the first node's file.
func ensureAdminKey(ctx context.Context, m *meta.Store, dataDir string, shared bool) (path string, created bool, err error) {
	path = filepath.Join(dataDir, "admin.key")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		key := strings.TrimSpace(string(b))
		if len(key) < 32 {
			return path, false, fmt.Errorf("%s holds no usable key (too short); delete it and restart to get a new one", path)
		}
		return path, false, putAdminKey(ctx, m, key)
	case !os.IsNotExist(err):
		return path, false, err
	}
	if shared {
		if _, kerr := m.KeyByName(ctx, meta.DefaultTenant, meta.OperatorKeyName); kerr == nil {
			return path, false, fmt.Errorf("%s is missing and another node registered the operator's key: copy admin.key from a node that has it (every node of a deployment shares it)", path)
		}
	}
	key, err := meta.NewKeySecret()
	if err != nil {
		return path, false, err
	}
	if err := writeFileAtomic(path, []byte(key+"\n"), 0o600); err != nil {
		return path, false, err
	}
	return path, true, putAdminKey(ctx, m, key)
}

// putAdminKey registers key as the operator's key, replacing (and
// un-revoking) any previous one.
func putAdminKey(ctx context.Context, m *meta.Store, key string) error {
	return m.PutKey(ctx, meta.APIKey{Tenant: meta.DefaultTenant, Name: meta.OperatorKeyName,
		Hash: meta.HashKey(key), Prefix: meta.KeyPrefix(key), Scopes: meta.AllScopes})
}

// writeFileAtomic writes data to path so that a reader sees the old content
// or the new, never a part, and the new survives power loss once it returns.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
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

// ensureMasterKey returns the checkpoint store's master key from
// DATA_DIR/master.key (hex, 0600), writing a new random one on first start.
// Every tenant's checkpoint keys derive from it: losing it loses every
// checkpoint, so it is written durably before any checkpoint uses it.
func ensureMasterKey(dataDir string, size int) ([]byte, error) {
	path := filepath.Join(dataDir, "master.key")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		key, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(key) != size {
			return nil, fmt.Errorf("%s does not hold a %d-byte hex key; restore it from a backup (a new key cannot read the existing checkpoints)", path, size)
		}
		return key, nil
	case !os.IsNotExist(err):
		return nil, err
	}
	key := make([]byte, size)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}
