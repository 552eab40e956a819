package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"
)

func TestAdminKeyLifecycle(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, err := sqlmeta.Open(filepath.Join(dir, "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	path, created, err := ensureAdminKey(ctx, m, dir, false)
	if err != nil || !created {
		t.Fatalf("first start: %v %v", created, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key mode %v", fi.Mode())
	}
	b, _ := os.ReadFile(path)
	key1 := strings.TrimSpace(string(b))
	if k, err := m.KeyByHash(ctx, meta.HashKey(key1)); err != nil || k.Tenant != "default" || !k.Has(meta.ScopeAdmin) || !k.Has(meta.ScopeWrite) || !k.Has(meta.ScopeRead) || k.Prefix != key1[:12] {
		t.Fatalf("key not accepted: %v", err)
	}
	if _, created, _ := ensureAdminKey(ctx, m, dir, false); created {
		t.Fatal("second start made a new key")
	}
	// Only the hash is stored.
	for _, f := range []string{"meta.db", "meta.db-wal"} {
		raw, _ := os.ReadFile(filepath.Join(dir, f))
		if strings.Contains(string(raw), key1) {
			t.Fatalf("%s holds the key itself", f)
		}
	}
	// A deleted key file gets a new key; the old one stops working.
	os.Remove(path)
	if _, created, err := ensureAdminKey(ctx, m, dir, false); err != nil || !created {
		t.Fatalf("after delete: %v %v", created, err)
	}
	if _, err := m.KeyByHash(ctx, meta.HashKey(key1)); !errdefs.IsNotFound(err) {
		t.Fatalf("old key still accepted: %v", err)
	}
}

// TestKeyFilePermissionsRefused: a key file its group or others may read
// (admin.key, master.key, --master-key-file) is refused at start, naming
// the file and the chmod that fixes it; at 0600 it is taken.
func TestKeyFilePermissionsRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, err := sqlmeta.Open(filepath.Join(dir, "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	admin := filepath.Join(dir, "admin.key")
	os.WriteFile(admin, []byte(strings.Repeat("k", 40)+"\n"), 0o600)
	master := filepath.Join(dir, "master.key")
	os.WriteFile(master, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	shared := filepath.Join(t.TempDir(), "shared-master.key")
	os.WriteFile(shared, []byte(strings.Repeat("cd", 32)+"\n"), 0o600)
	load := map[string]func() error{
		admin:  func() error { _, _, err := ensureAdminKey(ctx, m, dir, false); return err },
		master: func() error { _, err := ensureMasterKey(dir, 32); return err },
		shared: func() error { _, err := loadMasterKey(dir, shared, 32); return err },
	}
	for path, f := range load {
		for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
			os.Chmod(path, mode)
			err := f()
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "chmod 600 "+path) {
				t.Errorf("%s at %04o: %v; want a refusal naming the file and chmod 600", filepath.Base(path), mode, err)
			}
		}
		os.Chmod(path, 0o600)
		if err := f(); err != nil {
			t.Errorf("%s at 0600: %v", filepath.Base(path), err)
		}
		os.Chmod(path, 0o400)
		if err := f(); err != nil {
			t.Errorf("%s at 0400: %v", filepath.Base(path), err)
		}
	}
}

// TestAuditKeyFile: DATA_DIR/audit.key is made at first start (0600) and
// read after; --audit-key-file must exist and be 0600; on shared stores
// without it the key derives from the master key (the same on every node).
func TestAuditKeyFile(t *testing.T) {
	dir := t.TempDir()
	k1, err := auditKey(dir, "", "", false, 32)
	if err != nil || len(k1) != 32 {
		t.Fatalf("first start: %v", err)
	}
	path := filepath.Join(dir, "audit.key")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("audit.key: %v %v", fi, err)
	}
	if k2, err := auditKey(dir, "", "", false, 32); err != nil || string(k2) != string(k1) {
		t.Fatalf("second start: %v", err)
	}
	os.Chmod(path, 0o644)
	if _, err := auditKey(dir, "", "", false, 32); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Fatalf("audit.key at 0644: %v", err)
	}
	flag := filepath.Join(t.TempDir(), "audit.key")
	if _, err := auditKey(dir, flag, "", false, 32); err == nil {
		t.Fatal("a missing --audit-key-file was made up")
	}
	os.WriteFile(flag, []byte(strings.Repeat("01", 32)), 0o640)
	if _, err := auditKey(dir, flag, "", false, 32); err == nil || !strings.Contains(err.Error(), "chmod 600 "+flag) {
		t.Fatalf("--audit-key-file at 0640: %v", err)
	}
	os.Chmod(flag, 0o600)
	if k, err := auditKey(dir, flag, "", false, 32); err != nil || k[0] != 1 {
		t.Fatalf("--audit-key-file: %v", err)
	}
	master := filepath.Join(t.TempDir(), "master.key")
	os.WriteFile(master, []byte(strings.Repeat("ab", 32)), 0o600)
	a, err := auditKey(t.TempDir(), "", master, true, 32)
	b, err2 := auditKey(t.TempDir(), "", master, true, 32)
	if err != nil || err2 != nil || string(a) != string(b) || string(a) == strings.Repeat("\xab", 32) {
		t.Fatalf("derived on shared stores: %v %v", err, err2)
	}
}

// TestNodeTLSFlags: --tls-cert and --tls-key go together, the key file is
// refused with group/other permissions (naming chmod 600), a pair serves,
// and --node-ca must hold a certificate.
func TestNodeTLSFlags(t *testing.T) {
	dir := t.TempDir()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node-a"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(priv)
	cert, key, ca := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), filepath.Join(dir, "ca.crt")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o644)

	if _, _, err := nodeTLS(cert, "", ""); err == nil {
		t.Error("--tls-cert without --tls-key accepted")
	}
	if _, _, err := nodeTLS(cert, key, ""); err == nil || !strings.Contains(err.Error(), "chmod 600 "+key) {
		t.Errorf("a 0644 TLS key: %v; want a refusal naming chmod 600", err)
	}
	os.Chmod(key, 0o600)
	serve, peers, err := nodeTLS(cert, key, ca)
	if err != nil || serve == nil || len(serve.Certificates) != 1 || peers == nil || peers.RootCAs == nil {
		t.Fatalf("a good pair and CA: %v", err)
	}
	os.WriteFile(ca, []byte("not a certificate"), 0o644)
	if _, _, err := nodeTLS("", "", ca); err == nil {
		t.Error("a --node-ca without a certificate accepted")
	}
	if serve, peers, err := nodeTLS("", "", ""); err != nil || serve != nil || peers != nil {
		t.Errorf("no TLS flags: %v %v %v", serve, peers, err)
	}
}
