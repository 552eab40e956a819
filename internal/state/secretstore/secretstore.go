// Package secretstore keeps tenants' secrets and egress CAs at rest,
// sealed. Values and CA private keys are encrypted with AES-256-GCM under a
// key derived (HKDF-SHA256) from the daemon's master key, with the tenant and
// name as additional data, so a sealed value moved to another row does not
// open. The meta database only ever holds sealed bytes; the sandbox only
// ever holds placeholders (amber-secret://NAME) that the gateway replaces on
// the way out, for the hosts the secret is bound to.
package secretstore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/meta"
)

// MaxValue bounds a secret's value.
const MaxValue = 64 << 10

// Store is the secret store and the tenants' CAs. It implements
// gateway.Secrets and gateway.TLSTerminator. Safe for concurrent use.
type Store struct {
	meta metadata.Secrets
	aead cipher.AEAD

	mu  sync.Mutex
	cas map[string]*gateway.CA
}

// New returns a Store sealing with a key derived from masterKey.
func New(m metadata.Secrets, masterKey []byte) (*Store, error) {
	if len(masterKey) < 32 {
		return nil, errdefs.InvalidArgumentf("secret store: master key must be at least 32 bytes")
	}
	key, err := hkdf.Key(sha256.New, masterKey, nil, "amber secrets v1", 32)
	if err != nil {
		return nil, err
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	return &Store{meta: m, aead: aead, cas: map[string]*gateway.CA{}}, nil
}

func (s *Store) seal(ad string, plain []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, plain, []byte(ad)), nil
}

func (s *Store) open(ad string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], []byte(ad))
}

func secretAD(tenant, name string) string { return "secret\x00" + tenant + "\x00" + name }

// Put stores tenant's secret name, bound to hosts ("host:port" patterns).
func (s *Store) Put(ctx context.Context, tenant, name string, value []byte, hosts []string) error {
	if err := gateway.CheckSecretName(name); err != nil {
		return err
	}
	if len(value) == 0 || len(value) > MaxValue {
		return errdefs.InvalidArgumentf("secret %q: the value must be 1 byte to %d KiB", name, MaxValue>>10)
	}
	if len(hosts) == 0 {
		return errdefs.InvalidArgumentf("secret %q: bind it to at least one host:port it may be sent to", name)
	}
	if err := (meta.EgressPolicy{Allow: hosts}).Check(); err != nil {
		return err
	}
	sealed, err := s.seal(secretAD(tenant, name), value)
	if err != nil {
		return err
	}
	return s.meta.PutSecret(ctx, meta.SealedSecret{Tenant: tenant, Name: name, Sealed: sealed, Hosts: hosts})
}

// Secret implements gateway.Secrets.
func (s *Store) Secret(ctx context.Context, tenant, name string) (gateway.Secret, error) {
	x, err := s.meta.GetSecret(ctx, tenant, name)
	if err != nil {
		return gateway.Secret{}, err
	}
	v, err := s.open(secretAD(tenant, name), x.Sealed)
	if err != nil {
		return gateway.Secret{}, errdefs.DataLossf("secret %q of tenant %s does not unseal (wrong master key?)", name, tenant)
	}
	return gateway.Secret{Value: v, Hosts: x.Hosts}, nil
}

// List returns tenant's secrets without their values.
func (s *Store) List(ctx context.Context, tenant string) ([]meta.SealedSecret, error) {
	return s.meta.ListSecrets(ctx, tenant)
}

// Delete removes tenant's secret name.
func (s *Store) Delete(ctx context.Context, tenant, name string) error {
	return s.meta.DeleteSecret(ctx, tenant, name)
}

// CA returns tenant's egress CA, made and stored (key sealed) on first use.
func (s *Store) CA(ctx context.Context, tenant string) (*gateway.CA, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ca := s.cas[tenant]; ca != nil {
		return ca, nil
	}
	certPEM, sealedKey, err := s.meta.TenantCA(ctx, tenant)
	if errdefs.IsNotFound(err) {
		ca, err := gateway.NewCA(tenant)
		if err != nil {
			return nil, err
		}
		c, k, err := ca.PEM()
		if err != nil {
			return nil, err
		}
		sk, err := s.seal("ca\x00"+tenant, k)
		if err != nil {
			return nil, err
		}
		certPEM, sealedKey, err = s.meta.InsertTenantCA(ctx, tenant, c, sk)
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	keyPEM, err := s.open("ca\x00"+tenant, sealedKey)
	if err != nil {
		return nil, errdefs.DataLossf("egress CA of tenant %s does not unseal (wrong master key?)", tenant)
	}
	ca, err := gateway.LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("egress CA of tenant %s: %w", tenant, err)
	}
	s.cas[tenant] = ca
	return ca, nil
}

// CACert returns tenant's CA certificate (PEM), for sandbox trust stores.
func (s *Store) CACert(ctx context.Context, tenant string) ([]byte, error) {
	ca, err := s.CA(ctx, tenant)
	if err != nil {
		return nil, err
	}
	c, _, err := ca.PEM()
	return c, err
}

// ServerConfig implements gateway.TLSTerminator.
func (s *Store) ServerConfig(ctx context.Context, tenant, fallbackName string) (*tls.Config, error) {
	ca, err := s.CA(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return ca.ServerConfig(fallbackName), nil
}
