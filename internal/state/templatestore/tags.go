package templatestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

type tagFile struct {
	Version string    `json:"version"`
	Moved   time.Time `json:"moved"`
}

func (s *Store) tagPath(name string) string { return filepath.Join(s.cfg.Root, "tags", name+".json") }

func tagKey(name string) string { return "templates/tags/" + name }

// Tag points name at version digest. The version must be local (it is
// pushed to the blob store first when there is one); then the local tag
// moves, then the blob store's copy of it.
func (s *Store) Tag(ctx context.Context, name, digest string) error {
	if !ValidName.MatchString(name) {
		return errdefs.InvalidArgumentf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", name)
	}
	v, err := s.Version(ctx, digest)
	if err != nil {
		return err
	}
	if err := s.Push(ctx, v.Digest); err != nil {
		return err
	}
	b, _ := json.Marshal(tagFile{Version: v.Digest, Moved: time.Now().UTC()})
	if err := writeFileAtomic(s.tagPath(name), b); err != nil {
		return err
	}
	if s.HasBlobs() {
		if err := blob.PutBytes(ctx, s.cfg.Blobs, tagKey(name), b); err != nil {
			return fmt.Errorf("tag %s: the local tag moved; the blob store's copy did not: %w", name, err)
		}
	}
	return nil
}

// tagLocal points name at digest on this node only (adopted setup-script
// templates, whose push is deferred to their first checkpoint).
func (s *Store) tagLocal(name, digest string) error {
	b, _ := json.Marshal(tagFile{Version: digest, Moved: time.Now().UTC()})
	return writeFileAtomic(s.tagPath(name), b)
}

// Untag removes tag name (here and in the blob store); versions stay.
func (s *Store) Untag(ctx context.Context, name string) error {
	if s.HasBlobs() {
		if err := s.cfg.Blobs.Delete(ctx, tagKey(name)); err != nil {
			return err
		}
	}
	err := os.Remove(s.tagPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Tags returns every tag of this node → version digest.
func (s *Store) Tags() (map[string]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.cfg.Root, "tags"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		var t tagFile
		if b, err := os.ReadFile(filepath.Join(s.cfg.Root, "tags", e.Name())); err == nil && json.Unmarshal(b, &t) == nil {
			out[name] = t.Version
		}
	}
	return out, nil
}

// Resolve returns the version a reference names: "name" (its tag; a
// setup-script template or the blob store's tag when this node has none),
// "name@sha256:<hex>" or "sha256:<hex>" (that exact version; the name is
// not checked against the version's tags).
func (s *Store) Resolve(ctx context.Context, ref string) (Version, error) {
	name, digest, pinned := strings.Cut(ref, "@")
	if strings.HasPrefix(ref, "sha256:") {
		name, digest, pinned = "", ref, true
	}
	if pinned {
		return s.Version(ctx, digest)
	}
	if !ValidName.MatchString(name) {
		// No template can have this name: it is not found (names are
		// 1-32 of [a-z0-9_], starting with a letter).
		return Version{}, errdefs.NotFoundf("template %.60q (a template reference is NAME, NAME@sha256:<hex> or sha256:<hex>; names are 1-32 of [a-z0-9_])", ref)
	}
	var t tagFile
	b, err := os.ReadFile(s.tagPath(name))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &t); err != nil {
			return Version{}, errdefs.DataLossf("tag %s: %v", name, err)
		}
		return s.Version(ctx, t.Version)
	case !errors.Is(err, os.ErrNotExist):
		return Version{}, err
	}
	if v, err := s.adopt(ctx, name); err == nil || !errdefs.IsNotFound(err) {
		return v, err
	}
	if s.HasBlobs() {
		if b, err := blob.ReadAll(ctx, s.cfg.Blobs, tagKey(name), 1<<16); err == nil && json.Unmarshal(b, &t) == nil {
			v, err := s.Version(ctx, t.Version)
			if err == nil {
				_ = writeFileAtomic(s.tagPath(name), b)
			}
			return v, err
		}
	}
	return Version{}, errdefs.NotFoundf("template %q", name)
}
