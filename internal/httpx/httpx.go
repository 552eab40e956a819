// Package httpx holds small net/http helpers shared by the API server and
// the egress gateway.
package httpx

import "net/http"

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
