// Package httpx holds small net/http helpers shared by the API server, the
// API-only server and the egress gateway.
package httpx

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
)

// Bearer is the token of an Authorization header value of the Bearer
// scheme, whose name is case-insensitive (RFC 9110 §11.1: "bearer" and
// "BEARER" are Bearer too), the token after spaces; ok is false for
// another scheme or an empty token.
func Bearer(h string) (token string, ok bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// StatusWriter remembers the status a handler wrote (200 when it wrote a
// body without one), for access logs and spans.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush, Hijack and
// EnableFullDuplex of the writer underneath.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Forward proxies r to the HTTP server at addr (host:port) with header hdr
// set to by — how a node passes a call to the node that should answer it
// (X-Amber-Forwarded-By). Bodies stream both ways unbuffered (exec output,
// progress frames, event streams) and an Upgrade becomes a byte copy. When
// addr cannot be reached, fail answers instead.
//
// The answer streams back as it comes while the request's body is still
// being sent (HTTP/1.1 full duplex): without it, net/http ends the body
// once the answer's headers are out, and the connection to the other node
// breaks mid-answer (an exec's output, whose headers come first).
func Forward(w http.ResponseWriter, r *http.Request, addr, hdr, by string, fail func(http.ResponseWriter, error)) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex anyway
	target := &url.URL{Scheme: "http", Host: addr}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = r.Host
			pr.Out.Header.Set(hdr, by)
		},
		FlushInterval: -1,
		ErrorHandler:  func(w http.ResponseWriter, _ *http.Request, err error) { fail(w, err) },
	}
	p.ServeHTTP(w, r)
}
