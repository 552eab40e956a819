// Package templatestore keeps template versions: immutable root
// filesystems with their defaults, identified by the digest of their
// content, named by tags.
//
// # Vocabulary
//
// A version is one immutable template: a root filesystem plus defaults
// (env, working directory, user, limits) plus the exact package versions it
// holds (read from its dpkg database). Its id, the digest, is
//
//	"sha256:" + SHA-256(JSON{format, rootfs digest, defaults, packages})
//
// where the rootfs digest is the SHA-256 of the tree's canonical tar stream
// (WriteCanonical: every file, mode, owner, symlink, hard link, device,
// xattr, file mtime, in a fixed order). The same content imported or built
// twice is the same version; any change is another one. A tag is a name
// ("python") pointing at a version; moving a tag never changes a version,
// so a sandbox or checkpoint pinned to a version keeps its files.
//
// # Where versions live
//
// Every version is stored in the blob store through the chunk store (tenant
// SystemTenant, id "v-<hex>": the canonical tar as rootfs.tar, chunked and
// deduplicated, and the version record as version.json), so that a node with
// only the blob store can bring any version back. Each node keeps a local
// cache under Config.Root:
//
//	<root>/versions/<hex>/version.json  the record (with the local rootfs path)
//	<root>/versions/<hex>/rootfs/       the files (absent for an adopted
//	                                    setup-script template: its rootfs stays
//	                                    where `make setup` built it)
//	<root>/tags/<name>.json             the tag: {"version": digest}
//	<root>/legacy/<dir>.json            which version a setup-script directory is
//
// Version(ctx, digest) answers from the cache and otherwise fetches the
// version from the blob store (lazily, once: concurrent callers wait for one
// fetch), verifying the chunks, the record's digest and the rootfs digest of
// what it extracted before the version becomes visible in the cache.
//
// # Durability order
//
// Adding a version: the rootfs is complete and synced in a build directory
// (a name starting with "."), then its version.json, then the directory is
// renamed to versions/<hex> (and the parent synced): a crash leaves nothing
// or the whole version. Pushing it to the blob store: the chunks, then the
// manifest, then the commit pointer (the version record; chunkstore's
// order). Tag: the version is local (and, with a blob store, pushed: its
// pointer is durable) before the tag file is written atomically (temp file,
// fsync, rename, fsync dir), and the local tag before the blob store's
// copy. So no tag ever names a version that is not stored.
//
// Removing a version (Remove) deletes its blob pointer first (it is gone
// for every node), then its chunks (the chunk store's collection), then the
// local copy; the caller checks that nothing references it first.
package templatestore

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/chunkstore"
)

// SystemTenant is the chunk store tenant that holds template versions (not
// a valid tenant id of internal/state/meta, so no tenant can own it).
const SystemTenant = "sys_templates"

const formatTag = "amber-template/v1"

// ValidName is the form of a template name (a tag).
var ValidName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Defaults are what a sandbox born from the version gets unless it asks
// otherwise.
type Defaults struct {
	Env    []string       `json:"env,omitempty"`
	Cwd    string         `json:"cwd,omitempty"`
	User   string         `json:"user,omitempty"`
	Limits sandbox.Limits `json:"limits"`
}

// Version is the record of one template version.
type Version struct {
	// Digest identifies the version (see the package comment).
	Digest string `json:"digest"`
	// Name is the name it was first added under (a tag may differ).
	Name     string   `json:"name"`
	Defaults Defaults `json:"defaults"`
	// Packages maps each installed Debian package to its exact version.
	Packages map[string]string `json:"packages,omitempty"`
	RootFS   Tree              `json:"rootfs"`
	// Source says where the content came from ("import:<tarball sha256>",
	// "setup:<directory>", "build:<name>").
	Source  string    `json:"source,omitempty"`
	Created time.Time `json:"created"`
	// Aliases are older identifiers of the same content (the version
	// strings of setup-script templates before content addressing).
	Aliases []string `json:"aliases,omitempty"`

	// Path is the local rootfs directory; empty when not cached here.
	Path string `json:"path,omitempty"`
}

// Hex is the digest without its "sha256:" prefix.
func (v Version) Hex() string { return strings.TrimPrefix(v.Digest, "sha256:") }

// Short is the first 12 hex digits, for humans.
func (v Version) Short() string { return Short(v.Digest) }

// Short abbreviates a digest to 12 hex digits.
func Short(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// computeDigest is the version's id from its content.
func computeDigest(rootfs Tree, d Defaults, pk map[string]string) string {
	b, _ := json.Marshal(struct {
		Format   string            `json:"format"`
		RootFS   string            `json:"rootfs"`
		Defaults Defaults          `json:"defaults"`
		Packages map[string]string `json:"packages"`
	}{formatTag, rootfs.Digest, d, pk})
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Config configures a Store.
type Config struct {
	// Root is the node's local cache (see the package comment).
	Root string
	// LegacyDir holds templates built by the setup scripts
	// (<dir>/<name>-<anything>/rootfs, optional template.json); a name with
	// no tag is adopted from the lexically last such directory at its first
	// use. Empty: none.
	LegacyDir string
	// LegacyDefaults are the defaults of a setup-script template without a
	// template.json, by name.
	LegacyDefaults map[string]Defaults
	// Blobs and Chunks are the blob store and the chunk store over it;
	// nil keeps versions on this node only.
	Blobs  blob.Store
	Chunks *chunkstore.Store
	Logger *slog.Logger
}

// Store is a node's view of the template versions. It is safe for
// concurrent use (and for several processes sharing Root: every change is
// an atomic rename).
type Store struct {
	cfg Config
	lg  *slog.Logger

	mu      sync.Mutex
	flights map[string]*flight // "push:<hex>", "fetch:<hex>", "adopt:<name>"
}

type flight struct {
	done chan struct{}
	err  error
}

// Open returns the store over cfg.Root, creating it.
func Open(cfg Config) (*Store, error) {
	if cfg.Root == "" {
		return nil, errdefs.InvalidArgumentf("templatestore: no root directory")
	}
	for _, d := range []string{"versions", "tags", "legacy", "work"} {
		if err := os.MkdirAll(filepath.Join(cfg.Root, d), 0o755); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Store{cfg: cfg, lg: cfg.Logger, flights: map[string]*flight{}}, nil
}

// HasBlobs says whether versions are kept in a blob store.
func (s *Store) HasBlobs() bool { return s.cfg.Chunks != nil && s.cfg.Blobs != nil }

// once runs fn for key once among concurrent callers.
func (s *Store) once(key string, fn func() error) error {
	s.mu.Lock()
	if f, ok := s.flights[key]; ok {
		s.mu.Unlock()
		<-f.done
		return f.err
	}
	f := &flight{done: make(chan struct{})}
	s.flights[key] = f
	s.mu.Unlock()
	f.err = fn()
	s.mu.Lock()
	delete(s.flights, key)
	s.mu.Unlock()
	close(f.done)
	return f.err
}

func (s *Store) versionDir(hexd string) string { return filepath.Join(s.cfg.Root, "versions", hexd) }

// ParseDigest accepts "sha256:<64 hex>" or 64 hex digits.
func ParseDigest(d string) (string, error) {
	h := strings.TrimPrefix(d, "sha256:")
	if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", errdefs.InvalidArgumentf("template version %.80q: want sha256:<64 hex digits>", d)
	}
	return h, nil
}

// local reads a cached version's record.
func (s *Store) local(hexd string) (Version, error) {
	b, err := os.ReadFile(filepath.Join(s.versionDir(hexd), "version.json"))
	if errors.Is(err, os.ErrNotExist) {
		return Version{}, errdefs.NotFoundf("template version sha256:%s is not cached on this node", Short(hexd))
	}
	if err != nil {
		return Version{}, err
	}
	var v Version
	if err := json.Unmarshal(b, &v); err != nil {
		return v, errdefs.DataLossf("template version %s: version.json: %v", Short(hexd), err)
	}
	if v.Path == "" {
		v.Path = filepath.Join(s.versionDir(hexd), "rootfs")
	}
	if st, err := os.Stat(v.Path); err != nil || !st.IsDir() {
		return v, errdefs.NotFoundf("template version %s: rootfs %s is missing on this node", v.Short(), v.Path)
	}
	return v, nil
}

// Local lists the versions cached on this node, by digest.
func (s *Store) Local() ([]Version, error) {
	ents, err := os.ReadDir(filepath.Join(s.cfg.Root, "versions"))
	if err != nil {
		return nil, err
	}
	var out []Version
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if v, err := s.local(e.Name()); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// Remote lists the digests of the versions in the blob store.
func (s *Store) Remote(ctx context.Context) ([]string, error) {
	if !s.HasBlobs() {
		return nil, nil
	}
	infos, err := s.cfg.Chunks.List(ctx, SystemTenant)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, in := range infos {
		if h, ok := strings.CutPrefix(in.ID, "v-"); ok {
			out = append(out, "sha256:"+h)
		}
	}
	return out, nil
}

// Version returns version digest with a local rootfs: from the cache, or
// fetched from the blob store and verified (see the package comment).
// An alias (an old setup-script version string) of a cached version is
// accepted too.
func (s *Store) Version(ctx context.Context, digest string) (Version, error) {
	hexd, err := ParseDigest(digest)
	if err != nil {
		if v, ok := s.byAlias(digest); ok {
			return v, nil
		}
		return Version{}, err
	}
	if v, err := s.local(hexd); err == nil || !errdefs.IsNotFound(err) {
		return v, err
	}
	if !s.HasBlobs() {
		return Version{}, errdefs.NotFoundf("template version %s is not on this node and there is no blob store to fetch it from", Short(hexd))
	}
	if err := s.once("fetch:"+hexd, func() error { return s.fetch(ctx, hexd) }); err != nil {
		return Version{}, err
	}
	return s.local(hexd)
}

func (s *Store) byAlias(alias string) (Version, bool) {
	vs, _ := s.Local()
	for _, v := range vs {
		for _, a := range v.Aliases {
			if a == alias {
				return v, true
			}
		}
	}
	return Version{}, false
}

func randSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// fetch brings version hexd from the blob store into the cache.
func (s *Store) fetch(ctx context.Context, hexd string) error {
	if _, err := s.local(hexd); err == nil {
		return nil
	}
	start := time.Now()
	work := filepath.Join(s.cfg.Root, "work", "fetch-"+hexd[:12]+"-"+randSuffix())
	defer os.RemoveAll(work)
	if _, err := s.cfg.Chunks.Restore(ctx, SystemTenant, "v-"+hexd, work, chunkstore.RestoreOptions{}); err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.NotFoundf("template version sha256:%s is neither on this node nor in the blob store", Short(hexd))
		}
		return fmt.Errorf("fetch template version %s: %w", Short(hexd), err)
	}
	b, err := os.ReadFile(filepath.Join(work, "version.json"))
	if err != nil {
		return errdefs.DataLossf("template version %s in the blob store: no version.json", Short(hexd))
	}
	var v Version
	if err := json.Unmarshal(b, &v); err != nil {
		return errdefs.DataLossf("template version %s: version.json: %v", Short(hexd), err)
	}
	if v.Digest != "sha256:"+hexd || computeDigest(v.RootFS, v.Defaults, v.Packages) != v.Digest {
		return errdefs.DataLossf("template version %s: the stored record does not hash to its digest", Short(hexd))
	}
	build := filepath.Join(s.cfg.Root, "versions", ".fetch-"+hexd[:12]+"-"+randSuffix())
	defer os.RemoveAll(build)
	rootfs := filepath.Join(build, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(work, "rootfs.tar"))
	if err != nil {
		return errdefs.DataLossf("template version %s in the blob store: no rootfs.tar", Short(hexd))
	}
	err = Extract(bufio.NewReaderSize(f, 1<<20), rootfs)
	f.Close()
	if err != nil {
		return fmt.Errorf("fetch template version %s: %w", Short(hexd), err)
	}
	got, err := TreeDigest(rootfs)
	if err != nil {
		return err
	}
	if got.Digest != v.RootFS.Digest {
		return errdefs.DataLossf("template version %s: the fetched rootfs digests to %s, its record says %s", Short(hexd), got.Digest, v.RootFS.Digest)
	}
	v.Path = ""
	if err := s.install(build, v); err != nil {
		return err
	}
	s.lg.Info("template version fetched from the blob store", "version", v.Short(), "name", v.Name, "bytes", v.RootFS.Bytes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// install makes build (holding rootfs/ unless v.Path is set) the cached
// version v: sync, record, rename (see the durability order).
func (s *Store) install(build string, v Version) error {
	if err := syncfs(build); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(build, "version.json"), b); err != nil {
		return err
	}
	dst := s.versionDir(v.Hex())
	if err := os.Rename(build, dst); err != nil {
		if _, serr := os.Stat(filepath.Join(dst, "version.json")); serr == nil {
			return nil // another process installed it meanwhile
		}
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// Add makes the tree at build/rootfs a version named name (and tags it
// name unless noTag). build must be a directory under Root (see BuildDir);
// Add consumes it. The same content as an existing version returns that
// version with existed true.
func (s *Store) Add(ctx context.Context, name, build string, d Defaults, source string) (v Version, existed bool, err error) {
	defer os.RemoveAll(build)
	v, err = s.describe(name, filepath.Join(build, "rootfs"), d, source)
	if err != nil {
		return v, false, err
	}
	if old, err := s.local(v.Hex()); err == nil {
		return old, true, nil
	}
	if err := s.install(build, v); err != nil {
		return v, false, err
	}
	v, err = s.local(v.Hex())
	return v, false, err
}

// BuildDir returns a new empty directory under Root for Add, with an empty
// rootfs/ inside.
func (s *Store) BuildDir(name string) (string, error) {
	d, err := os.MkdirTemp(filepath.Join(s.cfg.Root, "versions"), ".build-"+name+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(d, 0o755); err != nil {
		return "", err
	}
	return d, os.Mkdir(filepath.Join(d, "rootfs"), 0o755)
}

// describe digests the tree at rootfs into a version record.
func (s *Store) describe(name, rootfs string, d Defaults, source string) (Version, error) {
	if !ValidName.MatchString(name) {
		return Version{}, errdefs.InvalidArgumentf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", name)
	}
	tree, err := TreeDigest(rootfs)
	if err != nil {
		return Version{}, fmt.Errorf("digest %s: %w", rootfs, err)
	}
	pk, err := dpkgPackages(rootfs)
	if err != nil {
		return Version{}, err
	}
	v := Version{Name: name, Defaults: d, Packages: pk, RootFS: tree, Source: source, Created: time.Now().UTC()}
	v.Digest = computeDigest(tree, d, pk)
	return v, nil
}

// dpkgPackages reads the installed packages and their exact versions from
// rootfs's dpkg database (what `dpkg-query -W` prints); nil without one.
func dpkgPackages(rootfs string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(rootfs, "var/lib/dpkg/status"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, para := range strings.Split(string(b), "\n\n") {
		f := map[string]string{}
		for _, line := range strings.Split(para, "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
				f[k] = v
			}
		}
		if f["Package"] == "" || !strings.HasSuffix(f["Status"], " installed") {
			continue
		}
		key := f["Package"]
		if f["Multi-Arch"] == "same" && f["Architecture"] != "" {
			key += ":" + f["Architecture"]
		}
		out[key] = f["Version"]
	}
	return out, nil
}

// Push stores version digest in the blob store if it is not there yet
// (chunks, manifest, pointer; see the package comment). It re-digests the
// local rootfs while writing it, so a local copy that changed since it was
// added is refused (errdefs.ErrDataLoss) instead of stored under the old
// digest. Without a blob store it does nothing.
func (s *Store) Push(ctx context.Context, digest string) error {
	if !s.HasBlobs() {
		return nil
	}
	hexd, err := ParseDigest(digest)
	if err != nil {
		return err
	}
	return s.once("push:"+hexd, func() error { return s.push(ctx, hexd) })
}

// Stored says whether version digest is in the blob store.
func (s *Store) Stored(ctx context.Context, digest string) (bool, error) {
	hexd, err := ParseDigest(digest)
	if err != nil || !s.HasBlobs() {
		return false, err
	}
	_, err = s.cfg.Chunks.Stat(ctx, SystemTenant, "v-"+hexd)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

func (s *Store) push(ctx context.Context, hexd string) error {
	if ok, err := s.Stored(ctx, hexd); err != nil || ok {
		return err
	}
	v, err := s.local(hexd)
	if err != nil {
		return err
	}
	start := time.Now()
	work := filepath.Join(s.cfg.Root, "work", "push-"+hexd[:12]+"-"+randSuffix())
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	f, err := os.Create(filepath.Join(work, "rootfs.tar"))
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	tree, err := WriteCanonical(v.Path, bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("push template version %s: %w", v.Short(), err)
	}
	if tree.Digest != v.RootFS.Digest {
		return errdefs.DataLossf("template version %s: its local rootfs %s changed since it was added (digest %s, recorded %s); re-import it", v.Short(), v.Path, tree.Digest, v.RootFS.Digest)
	}
	rec := v
	rec.Path = ""
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.WriteFile(filepath.Join(work, "version.json"), b, 0o600); err != nil {
		return err
	}
	res, err := s.cfg.Chunks.Put(ctx, SystemTenant, "v-"+hexd, work, chunkstore.PutOptions{
		Parent: s.previousVersion(v),
		Meta:   map[string]string{"kind": "template", "name": v.Name, "digest": v.Digest},
	})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		return nil
	}
	if err != nil && !res.Published {
		return fmt.Errorf("push template version %s: %w", v.Short(), err)
	}
	if err != nil {
		s.lg.Warn("template version stored; a step after its pointer failed", "version", v.Short(), "err", err)
	}
	s.lg.Info("template version stored in the blob store", "version", v.Short(), "name", v.Name, "chunks", res.Chunks, "new_chunks", res.NewChunks, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// previousVersion names the checkpoint of the newest other local version
// of v's template: the parent of v's push, whose manifest lists the chunks
// v shares with it (the chunk store deduplicates against a parent only). ""
// when there is none.
func (s *Store) previousVersion(v Version) string {
	vs, err := s.Local()
	if err != nil {
		return ""
	}
	var best Version
	for _, o := range vs {
		if o.Name == v.Name && o.Digest != v.Digest && (best.Digest == "" || o.Created.After(best.Created)) {
			best = o
		}
	}
	if best.Digest == "" {
		return ""
	}
	return "v-" + best.Hex()
}

// Evict removes version digest's local copy only (the blob store keeps it;
// the next Version fetches it again). An adopted setup-script template
// keeps its directory: only the record goes.
func (s *Store) Evict(digest string) error {
	hexd, err := ParseDigest(digest)
	if err != nil {
		return err
	}
	dir := s.versionDir(hexd)
	trash := filepath.Join(s.cfg.Root, "versions", ".trash-"+hexd[:12]+"-"+randSuffix())
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	_ = syncDir(filepath.Dir(dir))
	return os.RemoveAll(trash)
}

// Remove deletes version digest everywhere: the blob store's pointer,
// then its chunks, then the local copy, then legacy records naming it. The
// caller has checked that no tag, sandbox or checkpoint references it.
func (s *Store) Remove(ctx context.Context, digest string) error {
	hexd, err := ParseDigest(digest)
	if err != nil {
		return err
	}
	if s.HasBlobs() {
		if _, err := s.cfg.Chunks.DeleteCheckpoint(ctx, SystemTenant, "v-"+hexd); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove template version %s from the blob store: %w", Short(hexd), err)
		}
	}
	if err := s.Evict(digest); err != nil {
		return err
	}
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Root, "legacy"))
	for _, e := range ents {
		var m legacyMemo
		p := filepath.Join(s.cfg.Root, "legacy", e.Name())
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &m) == nil && m.Digest == "sha256:"+hexd {
			os.Remove(p)
		}
	}
	return nil
}

// CollectChunks removes template chunks no stored version references
// (left by a push that failed before its pointer); see chunkstore.GC.
func (s *Store) CollectChunks(ctx context.Context) error {
	if !s.HasBlobs() {
		return nil
	}
	_, err := s.cfg.Chunks.GC(ctx, SystemTenant)
	return err
}
