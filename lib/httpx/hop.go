package httpx

import (
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
)

// NodeTokenHeader carries the node token on a call that one node, or an
// API-only server, forwards to another node.
const NodeTokenHeader = "X-Amber-Node-Token"

// Hop authenticates the calls servers of one deployment forward to each
// other (a node to the node that runs a sandbox, the API-only server to a
// node): the sender adds the node token, a secret the operator gives every
// node and API server (--node-token-file), never a client's API key; the
// receiver refuses a call marked forwarded that lacks it. A nil Hop, or
// one without a Token, authenticates nothing (one node; or a deployment
// whose operator set no token: calls marked forwarded are taken as today).
//
// With TLS the hop is HTTPS, the other server's certificate verified
// against TLS.RootCAs (--node-ca): the token never crosses the network in
// the clear. A Hop is used by pointer and not copied.
type Hop struct {
	Token string
	TLS   *tls.Config

	once sync.Once
	rt   http.RoundTripper
}

// transport is the hop's round tripper; nil (http.DefaultTransport) for
// plain HTTP.
func (h *Hop) transport() http.RoundTripper {
	if h == nil || h.TLS == nil {
		return nil
	}
	h.once.Do(func() {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = h.TLS.Clone()
		h.rt = t
	})
	return h.rt
}

// Forward is the package's Forward with the hop's credential: the node
// token replaces whatever the client sent in NodeTokenHeader.
func (h *Hop) Forward(w http.ResponseWriter, r *http.Request, addr, hdr, by string, fail func(http.ResponseWriter, error)) {
	_ = http.NewResponseController(w).EnableFullDuplex()
	target := &url.URL{Scheme: "http", Host: addr}
	if h != nil && h.TLS != nil {
		target.Scheme = "https"
	}
	p := &httputil.ReverseProxy{
		Transport: h.transport(),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = r.Host
			pr.Out.Header.Set(hdr, by)
			pr.Out.Header.Del(NodeTokenHeader)
			if h != nil && h.Token != "" {
				pr.Out.Header.Set(NodeTokenHeader, h.Token)
			}
		},
		FlushInterval: -1,
		ErrorHandler:  func(w http.ResponseWriter, _ *http.Request, err error) { fail(w, err) },
	}
	p.ServeHTTP(w, r)
}

// Admit checks a call that arrived: marked forwarded (header hdr) it must
// carry the node token when the hop has one (ErrUnauthenticated if not).
// The token is removed from r either way, so it goes no further (to a
// sandbox's port, into a log, to another node).
func (h *Hop) Admit(r *http.Request, hdr string) error {
	got := r.Header.Get(NodeTokenHeader)
	r.Header.Del(NodeTokenHeader)
	if h == nil || h.Token == "" || r.Header.Get(hdr) == "" {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(h.Token)) != 1 {
		return fmt.Errorf("a call marked forwarded (%s) without this deployment's node token is refused: nodes and API servers forward with the token of --node-token-file, clients never set %s: %w", hdr, hdr, errdefs.ErrUnauthenticated)
	}
	return nil
}
