package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

func toAPIFile(fi sandbox.FileInfo) api.FileInfo {
	typ := "other"
	switch {
	case fi.Mode.IsDir():
		typ = "dir"
	case fi.Mode&os.ModeSymlink != 0:
		typ = "symlink"
	case fi.Mode.IsRegular():
		typ = "file"
	}
	return api.FileInfo{Name: fi.Name, Type: typ, Size: fi.Size, Mode: "0" + formatOctal(uint32(fi.Mode.Perm())),
		ModTime: fi.ModTime, Link: fi.Link}
}

func formatOctal(m uint32) string {
	s := ""
	for i := 0; i < 3; i++ {
		s = string(rune('0'+m&7)) + s
		m >>= 3
	}
	return s
}

// fs returns the filesystem of the request's sandbox and the path query
// parameter, an absolute sandbox path, cleaned.
func (s *Server) fs(r *http.Request, c *call, param string) (sandbox.FS, string, error) {
	p, err := sandboxPath(r, param)
	if err != nil {
		return nil, "", err
	}
	fsys, err := s.eng.Files(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return nil, "", err
	}
	return fsys, p, nil
}

// sandboxPath is query parameter param as a sandbox path: absolute (a
// relative one is refused, as MCP's tools and rename refuse it: relative
// to what would be a guess, and the sandbox's working directory is not
// the API's) and without NUL bytes, cleaned.
func sandboxPath(r *http.Request, param string) (string, error) {
	p, err := requireQuery(r, param)
	if err != nil {
		return "", err
	}
	return absPath(p)
}

func absPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.InvalidArgumentf("path %q holds a NUL byte", p)
	}
	if !strings.HasPrefix(p, "/") {
		return "", errdefs.InvalidArgumentf("path %q is not absolute: sandbox paths start with /", p)
	}
	return path.Clean(p), nil
}

// getFile returns a file's content, a directory's listing, or (stat=true)
// a FileInfo.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, c *call) error {
	stat, err := queryBool(r, "stat")
	if err != nil {
		return err
	}
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	fi, err := fsys.Stat(r.Context(), p)
	if err != nil {
		return err
	}
	switch {
	case stat:
		return writeJSON(w, http.StatusOK, toAPIFile(fi))
	case fi.Mode.IsDir():
		ents, err := fsys.List(r.Context(), p)
		if err != nil {
			return err
		}
		out := api.FileList{Path: p, Entries: []api.FileInfo{}}
		for _, e := range ents {
			out.Entries = append(out.Entries, toAPIFile(e))
		}
		return writeJSON(w, http.StatusOK, out)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	return fsys.ReadFile(r.Context(), p, w)
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request, c *call) error {
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o644)
	if err != nil {
		return err
	}
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	body, err := s.upload(r, "file "+p)
	if err != nil {
		return err
	}
	if err := body.check(fsys.WriteFile(r.Context(), p, body, os.FileMode(mode))); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, c *call) error {
	rec, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	if err := fsys.Remove(r.Context(), p, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, c *call) error {
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o755)
	if err != nil {
		return err
	}
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	if err := fsys.Mkdir(r.Context(), p, os.FileMode(mode)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// renameFile renames within the sandbox (sandbox.FS.Rename): a JSON
// {"from", "to"}, both absolute sandbox paths. Unlike the query paths of
// the other file routes, which are made absolute, a relative path here is
// refused: a rename's two ends are spelled out.
func (s *Server) renameFile(w http.ResponseWriter, r *http.Request, c *call) error {
	var req api.RenameRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	for _, p := range []string{req.From, req.To} {
		if _, err := absPath(p); err != nil {
			return fmt.Errorf("rename: %w", err)
		}
	}
	fsys, err := s.eng.Files(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := fsys.Rename(r.Context(), req.From, req.To); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) getTar(w http.ResponseWriter, r *http.Request, c *call) error {
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	if _, err := fsys.Stat(r.Context(), p); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-tar")
	return fsys.TarOut(r.Context(), p, w)
}

func (s *Server) putTar(w http.ResponseWriter, r *http.Request, c *call) error {
	fsys, p, err := s.fs(r, c, "path")
	if err != nil {
		return err
	}
	body, err := s.upload(r, "tar for "+p)
	if err != nil {
		return err
	}
	if err := body.check(fsys.TarIn(r.Context(), p, body)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// upload bounds r's body to Limits.MaxUploadBytes; a declared length over
// it is refused before anything is written.
func (s *Server) upload(r *http.Request, what string) (*limitedBody, error) {
	b := newLimitedBody(r.Body, s.limits.MaxUploadBytes, what)
	if r.ContentLength > s.limits.MaxUploadBytes {
		return nil, errdefs.TooLargef("%s of %s is larger than the daemon's limit of %s (max_upload_bytes)", what, size(r.ContentLength), size(s.limits.MaxUploadBytes))
	}
	return b, nil
}

// watchFiles streams changes under ?path= (recursive=true: below it too)
// as ndjson WatchEvents until the client goes away (see api.WatchEvent).
// Like the other streams it is one of the tenant's, ended by a revoked key.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request, c *call) error {
	p, err := sandboxPath(r, "path")
	if err != nil {
		return err
	}
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	ready := make(chan struct{})
	fl := http.NewResponseController(w) // through the middleware's writer
	enc := json.NewEncoder(w)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			_ = fl.Flush()
		}
	}
	// The answer's head goes once the watch is in place (a client then
	// knows changes from now on are seen), or with the first change.
	var mu sync.Mutex
	finished := false // the handler is answering: nothing more from the goroutine
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ready:
			mu.Lock()
			if !finished {
				start()
			}
			mu.Unlock()
		case <-done:
		}
	}()
	err = s.eng.WatchFiles(ctx, c.tenant, r.PathValue("id"), p, recursive, ready, func(e sandbox.WatchEvent) error {
		mu.Lock()
		defer mu.Unlock()
		start()
		if err := enc.Encode(api.WatchEvent{Path: e.Path, Op: e.Op}); err != nil {
			return err
		}
		_ = fl.Flush()
		return nil
	})
	mu.Lock()
	finished = true
	mu.Unlock()
	if r.Context().Err() != nil || (err == nil && started) {
		return nil // the client went away: the end of a watch
	}
	if started {
		c.lg.InfoContext(r.Context(), "watch ended", "err", err)
		return nil
	}
	if keyRevoked(ctx) {
		return errKeyRevoked
	}
	return err
}
