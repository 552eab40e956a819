package gateway

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
)

// PlaceholderPrefix starts a secret placeholder: the sandbox holds
// "amber-secret://stripe" where the real value would go.
const PlaceholderPrefix = "amber-secret://"

var placeholderRE = regexp.MustCompile(`amber-secret://([A-Za-z0-9_.-]+)`)

// Placeholder returns the placeholder of secret name.
func Placeholder(name string) string { return PlaceholderPrefix + name }

// Secret is a tenant's secret value and the destinations it may be sent to
// ("host:port" patterns as in Policy.Allow).
type Secret struct {
	Value []byte
	Hosts []string
}

// Secrets fetches a tenant's secrets. Errors must not contain the value.
// errdefs.ErrNotFound when the tenant has no such secret.
type Secrets interface {
	Secret(ctx context.Context, tenant, name string) (Secret, error)
}

// MemorySecrets is a Secrets kept in memory, each value sealed with
// AES-256-GCM under a key given at construction (bound to tenant and name),
// so a heap dump or a checkpoint of the daemon does not show plaintext.
type MemorySecrets struct {
	aead cipher.AEAD
	mu   sync.RWMutex
	m    map[string]sealed
}

type sealed struct {
	nonce, box []byte
	hosts      []string
}

// NewMemorySecrets returns an empty store sealing values with key (32 bytes).
func NewMemorySecrets(key []byte) (*MemorySecrets, error) {
	if len(key) != 32 {
		return nil, errdefs.InvalidArgumentf("secret store key must be 32 bytes, got %d", len(key))
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	return &MemorySecrets{aead: aead, m: map[string]sealed{}}, nil
}

func secretID(tenant, name string) string { return tenant + "\x00" + name }

// CheckSecretName says whether name can be a secret's name (what a
// placeholder can carry: letters, digits, '_', '.', '-').
func CheckSecretName(name string) error {
	if len(name) > 128 || !placeholderRE.MatchString(Placeholder(name)) || placeholderRE.FindStringSubmatch(Placeholder(name))[1] != name {
		return errdefs.InvalidArgumentf("secret name %q: use up to 128 letters, digits, '_', '.', '-'", name)
	}
	return nil
}

// Put stores tenant's secret name, bound to hosts.
func (s *MemorySecrets) Put(tenant, name string, value []byte, hosts ...string) error {
	if err := CheckSecretName(name); err != nil {
		return err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	box := s.aead.Seal(nil, nonce, value, []byte(secretID(tenant, name)))
	s.mu.Lock()
	s.m[secretID(tenant, name)] = sealed{nonce: nonce, box: box, hosts: append([]string(nil), hosts...)}
	s.mu.Unlock()
	return nil
}

// Secret implements Secrets.
func (s *MemorySecrets) Secret(_ context.Context, tenant, name string) (Secret, error) {
	s.mu.RLock()
	sl, ok := s.m[secretID(tenant, name)]
	s.mu.RUnlock()
	if !ok {
		return Secret{}, errdefs.NotFoundf("secret %q of tenant %s", name, tenant)
	}
	v, err := s.aead.Open(nil, sl.nonce, sl.box, []byte(secretID(tenant, name)))
	if err != nil {
		return Secret{}, errdefs.DataLossf("secret %q of tenant %s does not unseal", name, tenant)
	}
	return Secret{Value: v, Hosts: sl.hosts}, nil
}

// substitution is the set of secrets used by one request, for redaction.
type substitution struct {
	values [][]byte
	names  []string
}

// substituteSecrets returns a copy of h with every placeholder replaced by
// its value — in header values, and inside Basic credentials — when the
// secret is bound to host:port. A placeholder for a secret that is not bound
// to the destination (or does not exist) is an ErrPermissionDenied naming
// the secret, never its value.
func substituteSecrets(ctx context.Context, src Secrets, tenant string, h http.Header, host string, port uint16) (http.Header, *substitution, error) {
	out := h.Clone()
	sub := &substitution{}
	cache := map[string][]byte{}
	resolve := func(s string) (string, error) {
		var ferr error
		r := placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
			name := m[len(PlaceholderPrefix):]
			if v, ok := cache[name]; ok {
				return string(v)
			}
			if src == nil {
				ferr = errdefs.PermissionDeniedf("secret %q: the gateway has no secret store", name)
				return m
			}
			sec, err := src.Secret(ctx, tenant, name)
			if err != nil {
				ferr = errdefs.PermissionDeniedf("secret %q: %v", name, err)
				return m
			}
			bound := false
			for _, p := range sec.Hosts {
				bound = bound || matchDest(p, host, port)
			}
			if !bound {
				ferr = errdefs.PermissionDeniedf("secret %q is not bound to %s", name, joinHostPort(host, port))
				return m
			}
			cache[name] = sec.Value
			sub.values = append(sub.values, sec.Value)
			sub.names = append(sub.names, name)
			return string(sec.Value)
		})
		return r, ferr
	}
	for k, vs := range out {
		for i, v := range vs {
			if strings.HasPrefix(v, "Basic ") {
				if raw, err := base64.StdEncoding.DecodeString(v[len("Basic "):]); err == nil && placeholderRE.Match(raw) {
					r, err := resolve(string(raw))
					if err != nil {
						return nil, nil, err
					}
					vs[i] = "Basic " + base64.StdEncoding.EncodeToString([]byte(r))
					continue
				}
			}
			if !strings.Contains(v, PlaceholderPrefix) {
				continue
			}
			r, err := resolve(v)
			if err != nil {
				return nil, nil, err
			}
			vs[i] = r
		}
		out[k] = vs
	}
	return out, sub, nil
}

// redact replaces every secret value used by the request with its
// placeholder in b (an upstream echoing a credential must not hand it to the
// sandbox or the journal).
func (s *substitution) redact(b []byte) []byte {
	if s == nil {
		return b
	}
	for i, v := range s.values {
		if len(v) > 0 && bytes.Contains(b, v) {
			b = bytes.ReplaceAll(b, v, []byte(Placeholder(s.names[i])))
		}
	}
	return b
}

func (s *substitution) redactHeader(h http.Header) {
	if s == nil || len(s.values) == 0 {
		return
	}
	for _, vs := range h {
		for i, v := range vs {
			vs[i] = string(s.redact([]byte(v)))
		}
	}
}

// SecretBound says whether sec may be sent to host:port.
func SecretBound(sec Secret, host string, port uint16) bool {
	for _, p := range sec.Hosts {
		if matchDest(p, host, port) {
			return true
		}
	}
	return false
}
