package engine

// Template management (amber template …) and upgrades of sandboxes to
// another template version (amber sandbox upgrade).
//
// A version is referenced by every tag naming it, every sandbox that is not
// destroyed and was born on it (or restored onto it), and every checkpoint
// that is committed or being written on it. A referenced version is never
// removed (RemoveTemplate says by what); GCTemplates removes every version
// nothing references, here and in the blob store. The check and the removal
// hold tmplMu for writing, and a new sandbox's row is inserted holding it
// for reading, so a create cannot slip in between.

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/internal/state/templatestore"
)

// templateOps is template management (template_ops.go): it reads the warm
// pool's size (a version the pool holds is referenced) and nothing else
// beyond the core.
type templateOps struct {
	*core
	warm *pool
}

// TemplateRefs says what references a version.
type TemplateRefs struct {
	Tags        []string          `json:"tags,omitempty"`
	Sandboxes   []string          `json:"sandboxes,omitempty"`
	Checkpoints []string          `json:"checkpoints,omitempty"`
	owners      map[string]string // sandbox or checkpoint id → tenant
}

// For returns the references tenant may see: the tags, and its own
// sandboxes and checkpoints ("" sees all).
func (r TemplateRefs) For(tenant string) TemplateRefs {
	if tenant == "" {
		return r
	}
	out := TemplateRefs{Tags: r.Tags}
	for _, id := range r.Sandboxes {
		if r.owners[id] == tenant {
			out.Sandboxes = append(out.Sandboxes, id)
		}
	}
	for _, id := range r.Checkpoints {
		if r.owners[id] == tenant {
			out.Checkpoints = append(out.Checkpoints, id)
		}
	}
	return out
}

// Empty is true when nothing references the version.
func (r TemplateRefs) Empty() bool {
	return len(r.Tags) == 0 && len(r.Sandboxes) == 0 && len(r.Checkpoints) == 0
}

func (r TemplateRefs) String() string {
	var parts []string
	add := func(what string, ids []string) {
		if len(ids) == 0 {
			return
		}
		more := ""
		if len(ids) > 5 {
			ids, more = ids[:5], fmt.Sprintf(" and %d more", len(ids)-5)
		}
		parts = append(parts, what+" "+strings.Join(ids, ", ")+more)
	}
	add("tag", r.Tags)
	add("sandbox", r.Sandboxes)
	add("checkpoint", r.Checkpoints)
	return strings.Join(parts, "; ")
}

// TemplateInfo is a version with what references it.
type TemplateInfo struct {
	templatestore.Version
	Local  bool         `json:"local"`
	Stored bool         `json:"stored"`
	Refs   TemplateRefs `json:"refs"`
}

// templateRefs maps every referenced version (digest, or an old version
// string) to its references.
func (e *templateOps) templateRefs(ctx context.Context) (map[string]*TemplateRefs, error) {
	out := map[string]*TemplateRefs{}
	get := func(v string) *TemplateRefs {
		if _, err := templatestore.ParseDigest(v); err != nil {
			if v2, err := e.tpl.cat.Store().Version(ctx, v); err == nil {
				v = v2.Digest // an old version string: an alias
			}
		}
		if out[v] == nil {
			out[v] = &TemplateRefs{owners: map[string]string{}}
		}
		return out[v]
	}
	tags, err := e.tpl.cat.Store().Tags()
	if err != nil {
		return nil, err
	}
	for name, v := range tags {
		r := get(v)
		r.Tags = append(r.Tags, name)
	}
	sbs, err := e.meta.List(ctx, meta.Filter{})
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		r := get(sb.TemplateVersion)
		r.Sandboxes = append(r.Sandboxes, sb.ID)
		r.owners[sb.ID] = sb.Tenant
	}
	cks, err := e.meta.Checkpoints(ctx, meta.CheckpointFilter{States: []meta.CheckpointState{meta.CheckpointCommitted, meta.CheckpointPending}})
	if err != nil {
		return nil, err
	}
	for _, ck := range cks {
		r := get(ck.TemplateVersion)
		r.Checkpoints = append(r.Checkpoints, ck.ID)
		r.owners[ck.ID] = ck.Tenant
	}
	for _, r := range out {
		sort.Strings(r.Tags)
	}
	return out, nil
}

// ListTemplates returns every version known here or in the blob store,
// with its references. A setup-script template not used yet is not a
// version yet (it is digested at its first use: see Catalog).
func (e *templateOps) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	st := e.tpl.cat.Store()
	local, err := st.Local()
	if err != nil {
		return nil, err
	}
	remote, err := st.Remote(ctx)
	if err != nil {
		return nil, err
	}
	refs, err := e.templateRefs(ctx)
	if err != nil {
		return nil, err
	}
	byDigest := map[string]*TemplateInfo{}
	for _, v := range local {
		byDigest[v.Digest] = &TemplateInfo{Version: v, Local: true}
	}
	for _, d := range remote {
		if ti, ok := byDigest[d]; ok {
			ti.Stored = true
		} else {
			byDigest[d] = &TemplateInfo{Version: templatestore.Version{Digest: d}, Stored: true}
		}
	}
	var out []TemplateInfo
	for d, ti := range byDigest {
		if r := refs[d]; r != nil {
			ti.Refs = *r
		}
		out = append(out, *ti)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Created.After(out[j].Created)
	})
	return out, nil
}

// InspectTemplate returns the version ref names ("name", "name@digest",
// "digest"), fetching it if needed, with its references.
func (e *templateOps) InspectTemplate(ctx context.Context, ref string) (TemplateInfo, error) {
	v, err := e.tpl.cat.Store().Resolve(ctx, ref)
	if err != nil {
		return TemplateInfo{}, err
	}
	ti := TemplateInfo{Version: v, Local: true}
	ti.Stored, _ = e.tpl.cat.Store().Stored(ctx, v.Digest)
	refs, err := e.templateRefs(ctx)
	if err != nil {
		return ti, err
	}
	if r := refs[v.Digest]; r != nil {
		ti.Refs = *r
	}
	return ti, nil
}

// ImportTemplate makes the tarball r a version of name and moves the tag.
func (e *templateOps) ImportTemplate(ctx context.Context, name string, r io.Reader, d templatestore.Defaults) (templatestore.ImportResult, error) {
	if err := ValidateLimits(d.Limits); err != nil {
		return templatestore.ImportResult{}, err
	}
	res, err := e.tpl.cat.Store().Import(ctx, name, r, d)
	if err == nil {
		e.lg.Info("template imported", "name", name, "version", res.Version.Short(), "existed", res.Existed, "previous", templatestore.Short(res.Previous))
	}
	return res, err
}

// TagTemplate points tag name at the version ref names.
func (e *templateOps) TagTemplate(ctx context.Context, name, ref string) (templatestore.Version, error) {
	v, err := e.tpl.cat.Store().Resolve(ctx, ref)
	if err != nil {
		return v, err
	}
	return v, e.tpl.cat.Store().Tag(ctx, name, v.Digest)
}

// RemoveTemplate removes a tag ("name": the versions stay) or a version
// ("name@sha256:…" or "sha256:…"), which must not be referenced.
func (e *templateOps) RemoveTemplate(ctx context.Context, ref string) error {
	st := e.tpl.cat.Store()
	if !strings.Contains(ref, "@") && !strings.HasPrefix(ref, "sha256:") {
		tags, err := st.Tags()
		if err != nil {
			return err
		}
		if _, ok := tags[ref]; !ok {
			return errdefs.NotFoundf("template tag %q", ref)
		}
		if want, _ := e.warm.PoolSize(ref); want > 0 {
			return errdefs.FailedPreconditionf("template %s has a warm pool; restart the daemon without it first", ref)
		}
		return st.Untag(ctx, ref)
	}
	_, digest, ok := strings.Cut(ref, "@")
	if !ok {
		digest = ref
	}
	if _, err := templatestore.ParseDigest(digest); err != nil {
		return err
	}
	e.tpl.mu.Lock()
	defer e.tpl.mu.Unlock()
	refs, err := e.templateRefs(ctx)
	if err != nil {
		return err
	}
	if r := refs[digest]; r != nil && !r.Empty() {
		return errdefs.FailedPreconditionf("template version %s is still referenced by %s: destroy those sandboxes, delete those checkpoints or move those tags first", templatestore.Short(digest), r)
	}
	local, _ := st.Local()
	known := false
	for _, v := range local {
		known = known || v.Digest == digest
	}
	if stored, _ := st.Stored(ctx, digest); !known && !stored {
		return errdefs.NotFoundf("template version %s", templatestore.Short(digest))
	}
	if err := st.Remove(ctx, digest); err != nil {
		return err
	}
	e.lg.Info("template version removed", "version", templatestore.Short(digest))
	return nil
}

// GCTemplates removes every version that nothing references (here and in
// the blob store) and returns their digests.
func (e *templateOps) GCTemplates(ctx context.Context) ([]string, error) {
	all, err := e.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	e.tpl.mu.Lock()
	defer e.tpl.mu.Unlock()
	refs, err := e.templateRefs(ctx) // again, under the lock
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, ti := range all {
		if r := refs[ti.Digest]; r != nil && !r.Empty() {
			continue
		}
		if err := e.tpl.cat.Store().Remove(ctx, ti.Digest); err != nil {
			return removed, fmt.Errorf("gc template version %s: %w", ti.Short(), err)
		}
		removed = append(removed, ti.Digest)
	}
	if len(removed) > 0 {
		e.lg.Info("template versions collected", "count", len(removed))
	}
	if err := e.tpl.cat.Store().CollectChunks(ctx); err != nil {
		return removed, fmt.Errorf("gc template chunks: %w", err)
	}
	return removed, nil
}

// EventUpgraded is appended to both sandboxes' streams by Upgrade.
const EventUpgraded = "sandbox.upgraded" // UpgradedPayload

// UpgradedPayload is the payload of sandbox.upgraded, version 1.
type UpgradedPayload struct {
	// From is the upgraded sandbox (left stopped), To the new one.
	From        string `json:"from"`
	To          string `json:"to"`
	Template    string `json:"template"`
	FromVersion string `json:"from_version"`
	ToVersion   string `json:"to_version"`
	// Checkpoint is the cut the files were taken from (kept, tagged
	// pre-upgrade-…: `amber sandbox recover FROM` rolls back).
	Checkpoint string `json:"checkpoint"`
	// Files copied and paths removed (files the sandbox had deleted from
	// its template).
	Files   int `json:"files"`
	Removed int `json:"removed"`
}

// UpgradeRequest asks for sandbox Sandbox on template ref Template.
type UpgradeRequest struct {
	Tenant, Sandbox string
	// Template: "name", "name@sha256:<hex>" or "sha256:<hex>".
	Template string
}

// copyLayer applies a checkpoint's layer.tar (an overlay upper directory)
// — a large file's bytes read from the image's layer-blobs/ where the
// archive references them (openLayerBlob) —
// to sandbox id through its confined FS: whiteouts (0/0 character devices)
// remove the path, an opaque directory is emptied first, other devices are
// skipped, and regular files, directories, symlinks and hard links are
// extracted (owners become the sandbox's root, set-ID bits are dropped:
// confinedfs.TarIn).
func (e *templateOps) copyLayer(ctx context.Context, id, layerTar string) (files, removed int, err error) {
	fsys, err := e.drv.Files(ctx, id)
	if err != nil {
		return 0, 0, err
	}
	f, err := os.Open(layerTar)
	if err != nil {
		return 0, 0, errdefs.DataLossf("checkpoint image has no layer.tar: %v", err)
	}
	defer f.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- fsys.TarIn(ctx, "/", pr) }()
	tw := tar.NewWriter(pw)
	tr := tar.NewReader(f)
	fail := func(err error) (int, int, error) {
		pw.CloseWithError(err)
		<-done
		return files, removed, err
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(errdefs.DataLossf("layer.tar: %v", err))
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		switch h.Typeflag {
		case tar.TypeChar:
			if h.Devmajor == 0 && h.Devminor == 0 { // whiteout
				if err := fsys.Remove(ctx, name, true); err != nil && !errdefs.IsNotFound(err) {
					return fail(fmt.Errorf("remove %s: %w", name, err))
				}
				removed++
			}
			continue
		case tar.TypeBlock, tar.TypeFifo:
			continue
		case tar.TypeDir:
			if h.PAXRecords["SCHILY.xattr.trusted.overlay.opaque"] == "y" {
				if err := fsys.Remove(ctx, name, true); err != nil && !errdefs.IsNotFound(err) {
					return fail(fmt.Errorf("empty opaque %s: %w", name, err))
				}
			}
		case tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
			files++
		default:
			continue
		}
		nh := &tar.Header{Typeflag: h.Typeflag, Name: strings.TrimPrefix(name, "/"), Linkname: h.Linkname, Mode: h.Mode,
			Size: h.Size, ModTime: h.ModTime, Format: tar.FormatPAX}
		if h.Typeflag == tar.TypeLink {
			nh.Linkname = strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
		}
		if h.Typeflag != tar.TypeReg {
			nh.Size = 0
		}
		var blob *layerBlob
		if h.Typeflag == tar.TypeReg {
			if blob, err = openLayerBlob(filepath.Dir(layerTar), h); err != nil {
				return fail(err)
			}
		}
		if blob != nil {
			nh.Size = blob.size
		}
		if err := tw.WriteHeader(nh); err != nil {
			blob.close()
			return fail(err)
		}
		if blob != nil {
			err = blob.copyTo(tw)
			blob.close()
			if err != nil {
				return fail(err)
			}
		} else if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return fail(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fail(err)
	}
	pw.Close()
	return files, removed, <-done
}
