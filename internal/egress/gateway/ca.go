package gateway

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// CA is a tenant's egress certificate authority: Amber installs its
// certificate in the trust store of the tenant's sandboxes, and the gateway
// terminates their TLS with leaf certificates it signs on the fly, one per
// server name. Persist it with PEM and reload with LoadCA: it must outlive
// the daemon, since sandboxes (and their checkpoints) trust it.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	der  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA creates a CA for tenant (ECDSA P-256, valid ten years).
func NewCA(tenant string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Amber egress CA (" + tenant + ")", Organization: []string{"Amber"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return newCA(der, key)
}

// LoadCA loads a CA saved with PEM.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errdefs.InvalidArgumentf("egress CA: certificate or key is not PEM")
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errdefs.InvalidArgumentf("egress CA key: %v", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errdefs.InvalidArgumentf("egress CA key cannot sign")
	}
	return newCA(cb.Bytes, signer)
}

func newCA(der []byte, key crypto.Signer) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errdefs.InvalidArgumentf("egress CA certificate: %v", err)
	}
	return &CA{cert: cert, key: key, der: der, leaves: map[string]*tls.Certificate{}}, nil
}

// PEM returns the CA certificate (for sandbox trust stores) and its private
// key (PKCS #8, for the daemon's encrypted key storage).
func (ca *CA) PEM() (certPEM, keyPEM []byte, err error) {
	k, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}), nil
}

// Pool returns a pool holding only this CA (what a sandbox trusts).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// ServerConfig returns a TLS server configuration that presents, for each
// server name (SNI; the IP dialled when there is none), a leaf signed by ca.
func (ca *CA) ServerConfig(fallbackName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := hello.ServerName
			if name == "" {
				name = fallbackName
			}
			return ca.leaf(name)
		},
	}
}

func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(0, 0, 7),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: key, Leaf: leaf}
	ca.leaves[name] = c
	return c, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err)
	}
	return n
}

// TenantCAs is a TLSTerminator over one CA per tenant.
type TenantCAs struct {
	mu  sync.RWMutex
	cas map[string]*CA
}

// NewTenantCAs returns an empty set.
func NewTenantCAs() *TenantCAs { return &TenantCAs{cas: map[string]*CA{}} }

// Put sets tenant's CA.
func (t *TenantCAs) Put(tenant string, ca *CA) {
	t.mu.Lock()
	t.cas[tenant] = ca
	t.mu.Unlock()
}

// ServerConfig implements TLSTerminator.
func (t *TenantCAs) ServerConfig(_ context.Context, tenant, fallbackName string) (*tls.Config, error) {
	t.mu.RLock()
	ca := t.cas[tenant]
	t.mu.RUnlock()
	if ca == nil {
		return nil, errdefs.NotFoundf("no egress CA for tenant %s", tenant)
	}
	return ca.ServerConfig(fallbackName), nil
}
