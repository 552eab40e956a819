package templatestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

type legacyMemo struct {
	Key    string `json:"key"`
	Digest string `json:"digest"`
}

// adopt makes the newest setup-script directory of name a version (once:
// the digest is remembered under legacy/) and tags name to it on this node.
func (s *Store) adopt(ctx context.Context, name string) (Version, error) {
	if s.cfg.LegacyDir == "" {
		return Version{}, errdefs.NotFoundf("template %q", name)
	}
	var v Version
	err := s.once("adopt:"+name, func() error {
		var err error
		v, err = s.adoptOnce(name)
		return err
	})
	if err != nil {
		return v, err
	}
	return s.Resolve(ctx, name)
}

func (s *Store) adoptOnce(name string) (Version, error) {
	if _, err := os.Stat(s.tagPath(name)); err == nil {
		return Version{}, nil // adopted by a concurrent caller
	}
	dirs, _ := filepath.Glob(filepath.Join(s.cfg.LegacyDir, name+"-*"))
	// The newest build wins: when its inputs change (a package added), the
	// setup script publishes a directory under another key, and the key's
	// order says nothing about age.
	mtime := func(d string) int64 {
		if st, err := os.Stat(d); err == nil {
			return st.ModTime().UnixNano()
		}
		return 0
	}
	sort.Slice(dirs, func(i, j int) bool {
		if mi, mj := mtime(dirs[i]), mtime(dirs[j]); mi != mj {
			return mi < mj
		}
		return dirs[i] < dirs[j]
	})
	dir := ""
	for i := len(dirs) - 1; i >= 0; i-- {
		base := filepath.Base(dirs[i])
		if st, err := os.Stat(filepath.Join(dirs[i], "rootfs")); err == nil && st.IsDir() && !strings.HasPrefix(base, ".") {
			dir = dirs[i]
			break
		}
	}
	if dir == "" {
		return Version{}, errdefs.NotFoundf("template %q", name)
	}
	rootfs := filepath.Join(dir, "rootfs")
	d := s.cfg.LegacyDefaults[name]
	tj, _ := os.ReadFile(filepath.Join(dir, "template.json"))
	if tj != nil {
		var over Defaults
		if err := json.Unmarshal(tj, &over); err != nil {
			return Version{}, errdefs.InvalidArgumentf("template %s: %s/template.json: %v", name, dir, err)
		}
		if over.Env != nil {
			d.Env = over.Env
		}
		if over.Cwd != "" {
			d.Cwd = over.Cwd
		}
		if over.User != "" {
			d.User = over.User
		}
		d.Limits = over.Limits
	}
	pk, _ := os.ReadFile(filepath.Join(dir, "packages.txt"))
	var st unix.Stat_t
	if err := unix.Stat(rootfs, &st); err != nil {
		return Version{}, err
	}
	kh := sha256.New()
	fmt.Fprintf(kh, "%s\x00%d\x00%d.%d\x00", filepath.Base(dir), st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	kh.Write(tj)
	kh.Write([]byte{0})
	kh.Write(pk)
	key := hex.EncodeToString(kh.Sum(nil))
	memo := filepath.Join(s.cfg.Root, "legacy", filepath.Base(dir)+".json")
	var m legacyMemo
	if b, err := os.ReadFile(memo); err == nil && json.Unmarshal(b, &m) == nil && m.Key == key {
		if v, err := s.local(strings.TrimPrefix(m.Digest, "sha256:")); err == nil {
			return v, s.tagLocal(name, v.Digest)
		}
	}
	start := time.Now()
	// Digesting a setup-script template reads all of it (seconds for
	// python, tens for chromium). Every daemon on this machine adopts the
	// same directories, so the description is kept next to them too, under
	// the same key: a new data dir does not read the tree again.
	shared := filepath.Join(s.cfg.LegacyDir, ".adopted", filepath.Base(dir)+".json")
	var v Version
	var sm struct {
		Key     string  `json:"key"`
		Version Version `json:"version"`
	}
	if b, err := os.ReadFile(shared); err == nil && json.Unmarshal(b, &sm) == nil && sm.Key == key && sm.Version.Digest != "" {
		v = sm.Version
	} else {
		var err error
		if v, err = s.describe(name, rootfs, d, "setup:"+dir); err != nil {
			return v, err
		}
		sm.Key, sm.Version = key, v
		if b, err := json.Marshal(sm); err == nil {
			if os.MkdirAll(filepath.Dir(shared), 0o755) == nil {
				_ = writeFileAtomic(shared, b) // best effort: the cache may be read-only
			}
		}
	}
	// The version string setup-script templates had before content
	// addressing, so sandboxes recorded with it still find their files.
	oh := sha256.New()
	oh.Write([]byte(filepath.Base(dir)))
	oh.Write([]byte{0})
	oh.Write(pk)
	oh.Write(tj)
	v.Aliases = []string{"sha256:" + hex.EncodeToString(oh.Sum(nil))[:24]}
	if _, err := s.local(v.Hex()); err != nil {
		build, err := os.MkdirTemp(filepath.Join(s.cfg.Root, "versions"), ".adopt-"+name+"-")
		if err != nil {
			return v, err
		}
		v.Path = rootfs
		if err := s.install(build, v); err != nil {
			os.RemoveAll(build)
			return v, err
		}
	}
	b, _ := json.Marshal(legacyMemo{Key: key, Digest: v.Digest})
	if err := writeFileAtomic(memo, b); err != nil {
		return v, err
	}
	s.lg.Info("setup-script template adopted", "name", name, "dir", dir, "version", v.Short(), "took", time.Since(start).Round(time.Millisecond))
	return v, s.tagLocal(name, v.Digest)
}
