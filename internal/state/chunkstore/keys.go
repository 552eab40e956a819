package chunkstore

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/restic/chunker"

	"github.com/amber-run/amber/core/errdefs"
)

// MasterKeySize is the length of Config.MasterKey.
const MasterKeySize = 32

const hkdfSalt = "amber/chunkstore/v1"

// tenantKeys is what one tenant's data is sealed and named with.
type tenantKeys struct {
	tenant  string
	aead    cipher.AEAD
	nameKey []byte
	pol     chunker.Pol
}

func deriveTenantKeys(master []byte, tenant string) (*tenantKeys, error) {
	derive := func(purpose string) ([]byte, error) {
		return hkdf.Key(sha256.New, master, []byte(hkdfSalt), "tenant\x00"+tenant+"\x00"+purpose, 32)
	}
	encKey, err := derive("seal")
	if err != nil {
		return nil, err
	}
	nameKey, err := derive("name")
	if err != nil {
		return nil, err
	}
	polSeed, err := derive("chunker-polynomial")
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(encKey)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	// A deterministic stream from the seed picks the tenant's irreducible
	// polynomial: the same tenant always chunks the same way (so it dedups
	// across processes), and chunk boundaries differ between tenants.
	pol, err := chunker.DerivePolynomial(rand.NewChaCha8([32]byte(polSeed)))
	if err != nil {
		return nil, fmt.Errorf("derive chunker polynomial: %w", err)
	}
	return &tenantKeys{tenant: tenant, aead: aead, nameKey: nameKey, pol: pol}, nil
}

// chunkName is the tenant-keyed name of a chunk with plaintext hash sum.
func (k *tenantKeys) chunkName(sum [32]byte) string {
	m := hmac.New(sha256.New, k.nameKey)
	m.Write(sum[:])
	return hex.EncodeToString(m.Sum(nil))
}

// validateID checks a tenant or checkpoint id: one key segment of at most
// 128 bytes, letters, digits, '.', '_', '-', starting with a letter or digit.
func validateID(what, id string) error {
	if id == "" || len(id) > 128 {
		return errdefs.InvalidArgumentf("%s id %q: must be 1 to 128 bytes", what, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return errdefs.InvalidArgumentf("%s id %q: character %q not allowed", what, id, c)
		}
	}
	return nil
}

// Key layout (see the package comment).

func tenantPrefix(t string) string         { return "tenants/" + t + "/" }
func chunksPrefix(t string) string         { return tenantPrefix(t) + "chunks/" }
func checkpointsPrefix(t string) string    { return tenantPrefix(t) + "checkpoints/" }
func checkpointPrefix(t, id string) string { return checkpointsPrefix(t) + id + "/" }
func pendingPrefix(t string) string        { return tenantPrefix(t) + "pending/" }
func gcLockKey(t string) string            { return tenantPrefix(t) + "gc.lock" }
func pointerKey(t, id string) string       { return checkpointPrefix(t, id) + pointerName }
func manifestKey(t, id, digest string) string {
	return checkpointPrefix(t, id) + manifestPrefix + digest
}
func chunkKey(t, name string) string { return chunksPrefix(t) + name[:2] + "/" + name }
func packsPrefix(t string) string    { return tenantPrefix(t) + "packs/" }
func packKey(t, name string) string  { return packsPrefix(t) + name[:2] + "/" + name }

// packNameFromKey returns the pack name of a key under packsPrefix, or "".
func packNameFromKey(t, key string) string {
	rest, ok := strings.CutPrefix(key, packsPrefix(t))
	if !ok {
		return ""
	}
	_, name, ok := strings.Cut(rest, "/")
	if !ok || !isPackName(name) || rest[:2] != name[:2] {
		return ""
	}
	return name
}

const (
	pointerName    = "COMMITTED"
	manifestPrefix = "manifest."
)

// chunkNameFromKey returns the chunk name of a key under chunksPrefix, or "".
func chunkNameFromKey(t, key string) string {
	rest, ok := strings.CutPrefix(key, chunksPrefix(t))
	if !ok {
		return ""
	}
	_, name, ok := strings.Cut(rest, "/")
	if !ok || len(name) != 64 || rest[:2] != name[:2] {
		return ""
	}
	return name
}
