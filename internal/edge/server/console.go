package server

import (
	"io/fs"
	"net/http"
	"path"
	"strings"
)

// The web console (console/ in the repository) is a single-page app that
// is a client of this API like any other: it signs in with an API key
// (kept in the browser's sessionStorage, sent as a Bearer header) and
// calls the public routes. Its built assets are embedded in the binary
// (console.Assets) and served here, at /console/, without authentication:
// they hold no data. Any path under /console/ that is not an asset is
// answered with index.html (the app routes in the browser).

// consoleHandler serves fsys at /console/.
func consoleHandler(fsys fs.FS) http.Handler {
	files := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/console" {
			http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
			return
		}
		h := w.Header()
		// The app loads only its own scripts and styles and talks only to
		// this origin (fetch, the terminal's WebSocket).
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		p := strings.TrimPrefix(r.URL.Path, "/console/")
		if p != "" {
			if st, err := fs.Stat(fsys, path.Clean(p)); err == nil && !st.IsDir() {
				if strings.HasPrefix(p, "assets/") {
					h.Set("Cache-Control", "public, max-age=31536000, immutable") // names carry a content hash
				}
				r2 := r.Clone(r.Context())
				r2.URL.Path = "/" + p
				files.ServeHTTP(w, r2)
				return
			}
		}
		h.Set("Cache-Control", "no-cache")
		b, err := fs.ReadFile(fsys, "index.html")
		if err != nil {
			http.Error(w, "console not built into this binary (make console)", http.StatusNotFound)
			return
		}
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.Write(b)
	})
}
