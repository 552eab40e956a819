package envd

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// envd's plain HTTP routes: GET /files reads a file, POST /files writes
// files (multipart, each part's filename its path when ?path= is not
// given, or the raw body with Content-Type application/octet-stream), and
// GET /health says whether the sandbox runs. Errors are envd's JSON
// {"message", "code"}, with the status of the error's kind. The
// ?username= the SDK sends is accepted and not used: commands and files
// run as the sandbox's user.

// httpError is envd's error body.
type httpError struct {
	Message string `json:"message"`
	Code    int    `json:"code"`
}

func writeError(w http.ResponseWriter, err error) {
	code := errdefs.HTTPStatus(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(httpError{Message: err.Error(), Code: code})
}

// writtenEntry is envd's answer per written file.
type writtenEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func (s *service) getFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("path") {
		writeError(w, errdefs.InvalidArgumentf("missing ?path= (an absolute sandbox path)"))
		return
	}
	fsys, p, err := s.fs(r.Context(), q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	fi, err := fsys.Stat(r.Context(), p)
	if err != nil {
		writeError(w, err)
		return
	}
	if fi.Mode.IsDir() {
		writeError(w, errdefs.InvalidArgumentf("path %s is a directory: list it with ListDir", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	if err := fsys.ReadFile(r.Context(), p, w); err != nil {
		s.lg.WarnContext(r.Context(), "envd: file read failed", "path", p, "err", err)
	}
}

// capped reads at most n bytes of r; one more is an error, and over says
// so afterwards whatever the reader's caller made of that error.
type capped struct {
	r    io.Reader
	n    int64
	over bool
}

func (c *capped) Read(p []byte) (int, error) {
	if c.n < 0 {
		c.over = true
		return 0, errdefs.TooLargef("the upload is larger than the limit")
	}
	if int64(len(p)) > c.n+1 {
		p = p[:c.n+1]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	if c.n < 0 {
		c.over = true
		return n, errdefs.TooLargef("the upload is larger than the limit")
	}
	return n, err
}

func (s *service) postFile(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > s.maxUpload {
		writeError(w, errdefs.TooLargef("the upload of %d bytes is larger than the daemon's limit of %d bytes (max_upload_bytes)", r.ContentLength, s.maxUpload))
		return
	}
	body := &capped{r: r.Body, n: s.maxUpload}
	r.Body = io.NopCloser(body)
	out, err := s.writeFiles(r)
	if body.over {
		// Whatever the write made of the reader's error: the upload was
		// too large (and what was written of it is partial).
		err = errdefs.TooLargef("the upload is larger than the daemon's limit of %d bytes (max_upload_bytes)", s.maxUpload)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *service) writeFiles(r *http.Request) ([]writtenEntry, error) {
	q := r.URL.Query()
	target := q.Get("path")
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return nil, errdefs.InvalidArgumentf("Content-Type %q: %v (send multipart/form-data or application/octet-stream)", r.Header.Get("Content-Type"), err)
	}
	switch {
	case ct == "application/octet-stream":
		if target == "" {
			return nil, errdefs.InvalidArgumentf("an application/octet-stream upload needs ?path=")
		}
		body := io.Reader(r.Body)
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				return nil, errdefs.InvalidArgumentf("the gzip body: %v", err)
			}
			defer zr.Close()
			body = zr
		}
		e, err := s.writeOne(r, target, body)
		if err != nil {
			return nil, err
		}
		return []writtenEntry{e}, nil
	case strings.HasPrefix(ct, "multipart/"):
		mr := multipart.NewReader(r.Body, params["boundary"])
		var out []writtenEntry
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				return out, errdefs.InvalidArgumentf("the multipart body: %v", err)
			}
			if part.FormName() != "file" {
				continue
			}
			p := target
			if p == "" {
				p = partFilename(part)
			}
			e, err := s.writeOne(r, p, part)
			if err != nil {
				return out, err
			}
			out = append(out, e)
		}
		if len(out) == 0 {
			return nil, errdefs.InvalidArgumentf("the multipart body holds no \"file\" part")
		}
		return out, nil
	}
	return nil, errdefs.InvalidArgumentf("Content-Type %q: send multipart/form-data or application/octet-stream", ct)
}

// partFilename is a part's filename as sent: the SDK puts the file's
// whole path there, which multipart.Part.FileName would cut to its base.
func partFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

func (s *service) writeOne(r *http.Request, p string, body io.Reader) (writtenEntry, error) {
	if p == "" {
		return writtenEntry{}, errdefs.InvalidArgumentf("a file part has no path (no ?path= and no filename)")
	}
	fsys, p, err := s.fs(r.Context(), p)
	if err != nil {
		return writtenEntry{}, err
	}
	if err := fsys.WriteFile(r.Context(), p, body, 0o644); err != nil {
		return writtenEntry{}, fmt.Errorf("write %s: %w", p, err)
	}
	return writtenEntry{Name: path.Base(p), Type: "file", Path: p}, nil
}

// health answers 204 when the sandbox runs (an idle-stopped one is woken,
// as every call wakes it), else 502: the SDK reads a 502 as a sandbox
// that is gone.
func (s *service) health(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	if _, err := s.eng.Wake(r.Context(), c.tenant, c.id); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_ = json.NewEncoder(w).Encode(httpError{Message: err.Error(), Code: http.StatusBadGateway})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
