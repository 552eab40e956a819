package main

import (
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/httpx"
)

// readKeyFile reads a secret file the daemon starts from (admin.key,
// master.key, the audit key, a TLS key, the node token), refusing one that
// its group or others may read or write: a key another account of the host
// can read is not a secret. It returns the os error of a missing file as
// is (os.IsNotExist holds), so callers can create it.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %04o: group or others may read or write it, so it is no secret; fix: chmod 600 %s (and check who read it)", path, perm, path)
	}
	return io.ReadAll(f)
}

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
func ensureAdminKey(ctx context.Context, m metadata.Keys, dataDir string, shared bool) (path string, created bool, err error) {
	path = filepath.Join(dataDir, "admin.key")
	b, err := readKeyFile(path)
	switch {
	case err == nil:
		key := strings.TrimSpace(string(b))
		if len(key) < 32 {
			return path, false, errdefs.FailedPreconditionf("%s holds no usable key (too short); delete it and restart to get a new one", path)
		}
		return path, false, putAdminKey(ctx, m, key)
	case !os.IsNotExist(err):
		return path, false, err
	}
	if shared {
		if _, kerr := m.KeyByName(ctx, meta.DefaultTenant, meta.OperatorKeyName); kerr == nil {
			return path, false, errdefs.FailedPreconditionf("%s is missing and another node registered the operator's key: copy admin.key from a node that has it (every node of a deployment shares it)", path)
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
func putAdminKey(ctx context.Context, m metadata.Keys, key string) error {
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
	b, err := readKeyFile(path)
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

// auditKey returns the key of the audit chain (internal/state/audit), kept
// outside the event log:
//
//   - keyFile given (--audit-key-file): its hex key, which must exist
//     (every node of a deployment shares it);
//   - on shared stores without it: derived by HKDF from the master key
//     every node already shares (--master-key-file);
//   - else DATA_DIR/audit.key, written (0600, durably) on first start.
//
// A trail written before keys stays verifiable (its records are version 1).
func auditKey(dataDir, keyFile, masterKeyFile string, shared bool, masterSize int) ([]byte, error) {
	if keyFile != "" {
		b, err := readKeyFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--audit-key-file: %w", err)
		}
		key, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) != audit.KeySize {
			return nil, fmt.Errorf("--audit-key-file %s does not hold a %d-byte hex key (make one with: head -c 32 /dev/urandom | xxd -p -c 64 > audit.key; chmod 600 audit.key)", keyFile, audit.KeySize)
		}
		return key, nil
	}
	if shared {
		master, err := loadMasterKey(dataDir, masterKeyFile, masterSize)
		if err != nil {
			return nil, err
		}
		return hkdf.Key(sha256.New, master, nil, "amber audit chain v2", audit.KeySize)
	}
	path := filepath.Join(dataDir, "audit.key")
	b, err := readKeyFile(path)
	switch {
	case err == nil:
		key, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(key) != audit.KeySize {
			return nil, fmt.Errorf("%s does not hold a %d-byte hex key; restore it from a backup (the trail's keyed records cannot be verified without it)", path, audit.KeySize)
		}
		return key, nil
	case !os.IsNotExist(err):
		return nil, err
	}
	key := make([]byte, audit.KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// openAudit opens the audit trail over log: keyed (auditKey) and anchored
// in DATA_DIR/audit.head (internal/state/audit's package comment).
func openAudit(log eventlog.Store, dataDir, keyFile string, so sharedOptions) (*audit.Trail, error) {
	key, err := auditKey(dataDir, keyFile, so.masterKeyFile, so.shared(), chunkstore.MasterKeySize)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	anchor, err := audit.OpenFileAnchor(filepath.Join(dataDir, "audit.head"))
	if err != nil {
		return nil, err
	}
	return audit.Open(log, audit.Options{Key: key, Anchor: anchor})
}

// nodeHop returns the credential of calls forwarded between the servers
// of a deployment (httpx.Hop) from --node-token-file (mode 0600, the same
// file on every node and API server, at least 32 characters); "" gives a
// Hop that authenticates nothing.
func nodeHop(tokenFile string) (*httpx.Hop, error) {
	if tokenFile == "" {
		return &httpx.Hop{}, nil
	}
	b, err := readKeyFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("--node-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 32 || strings.ContainsAny(tok, " \t\r\n") {
		return nil, fmt.Errorf("--node-token-file %s: want one line of at least 32 characters (make one with: head -c 32 /dev/urandom | xxd -p -c 64 > node.token; chmod 600 node.token)", tokenFile)
	}
	return &httpx.Hop{Token: tok}, nil
}

// nodeTLS reads the TLS flags of a server of a deployment: certFile and
// keyFile (both or neither; the key 0600) make it serve HTTPS, caFile
// (PEM) makes the calls it forwards to the other servers HTTPS, their
// certificates verified against it. Either config is nil when unset.
func nodeTLS(certFile, keyFile, caFile string) (serve, peers *tls.Config, err error) {
	if (certFile == "") != (keyFile == "") {
		return nil, nil, usageError{fmt.Errorf("--tls-cert and --tls-key go together")}
	}
	if certFile != "" {
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-cert: %w", err)
		}
		keyPEM, err := readKeyFile(keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-key: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", certFile, keyFile, err)
		}
		serve = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--node-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("--node-ca %s holds no PEM certificate", caFile)
		}
		peers = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return serve, peers, nil
}
