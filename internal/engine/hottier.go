package engine

// The hot tier: the newest image of each sandbox stays on the node, in the
// driver's own format, so that a restore on this node (a sandbox crash, a
// daemon restart, an idle resume, a restore to an event, a fork) starts
// from it instead of fetching, decrypting and verifying every chunk from
// the chunk store. The chunk store stays the durable, deduplicated,
// encrypted tier and the source for other nodes.
//
// # Durability order
//
// A hot copy is kept only after its checkpoint committed (pointer, log
// event, row: checkpoint.go) — or, for a strict checkpoint on local
// stores, before its local commit, pinned until its upload ends
// (keepLocal; the order at the top of checkpoint.go) — and it counts only
// once complete:
//
//  1. every file of the cut directory is fsync'd (the driver wrote them);
//  2. hot.json, naming the checkpoint, its image digest and each file's
//     size, modification time and inode, is written and fsync'd in it;
//  3. the directory is renamed to hot/<checkpoint> and hot/ is fsync'd.
//
// A crash before 3 leaves a cut-* directory that the next start removes; a
// hot/<id> directory is always whole. A copy that fails its check is
// removed and the restore is cold.
//
// # Integrity
//
// Before a restore uses a hot copy, hot.json's digest must be the committed
// checkpoint's image digest (so a copy is never used for another
// checkpoint), and every file must have the size, modification time and
// inode recorded when it was made durable: a file rewritten since, or
// replaced, fails the check without reading its bytes. After the sandbox
// runs again, the copy's bytes are read in the background and each file's
// content digest compared with the committed manifest's (bit rot, a write
// that kept the times); a mismatch removes the copy and is logged as an
// error.
//
// The driver restores from a directory of hard links to the copy's files,
// so whatever the driver does to its image directory (ownership and modes
// for CRIU) leaves the copy as it was, and the copy stays until a newer
// checkpoint of its sandbox replaces it, the sandbox is destroyed, or the
// size bound evicts it (oldest first).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
)

// DefaultHotTierBytes bounds the hot tier when RecoveryOptions.HotTierBytes
// is 0.
const DefaultHotTierBytes = 8 << 30

const hotMetaName = "hot.json"

// HotTierDir is the hot tier's directory under Options.WorkDir: whoever
// empties the work directory at start (amber up) keeps it.
const HotTierDir = "hot"

// verifyBytesPerSec paces the byte check after a hot restore: it runs
// beside the sandboxes (a restored one is running already) and must not
// take the disk and a core from them, or from the next cut.
const verifyBytesPerSec = 64 << 20

// hotTier is the node's hot copies, under dir (one directory per
// checkpoint). Its methods are safe for concurrent use.
type hotTier struct {
	dir   string
	limit int64 // < 0: off
	lg    *slog.Logger

	mu sync.Mutex // guards the directory's contents
	// pinned are the copies of checkpoints whose upload is pending
	// (upload.go): neither a newer copy of their sandbox nor the size
	// bound removes them, only unpin, drop or their upload's failure.
	pinned map[string]bool
	// held counts, per checkpoint, the lazy restores still loading from
	// its copy (lazy.go): as pinned, until unhold.
	held map[string]int

	// Copies being made in the background (keepAsync), waited for by
	// wait (Engine.Close).
	fmu    sync.Mutex
	flying int
	landed *sync.Cond
}

// hotMeta is a hot copy's hot.json.
type hotMeta struct {
	Checkpoint  string    `json:"checkpoint"`
	Sandbox     string    `json:"sandbox"`
	ImageDigest string    `json:"image_digest"`
	Size        int64     `json:"size"`
	Files       []hotFile `json:"files"`
	Kept        time.Time `json:"kept"`
	// Meta, for a copy kept before its upload (keepLocal), is the
	// manifest metadata its upload will record: what a restore checks
	// (hostcompat.go) before the manifest exists.
	Meta map[string]string `json:"meta,omitempty"`
}

type hotFile struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode"`
}

func newHotTier(workDir string, limit int64, lg *slog.Logger) *hotTier {
	if limit == 0 {
		limit = DefaultHotTierBytes
	}
	h := &hotTier{dir: filepath.Join(workDir, HotTierDir), limit: limit, lg: lg, pinned: map[string]bool{}, held: map[string]int{}}
	h.landed = sync.NewCond(&h.fmu)
	return h
}

// spawn runs fn in the background, as one of the copies wait waits for.
func (h *hotTier) spawn(fn func()) {
	h.fmu.Lock()
	h.flying++
	h.fmu.Unlock()
	go func() {
		defer func() {
			h.fmu.Lock()
			h.flying--
			h.landed.Broadcast()
			h.fmu.Unlock()
		}()
		fn()
	}()
}

// keepAsync is keep after the checkpoint call has returned (the fsyncs are
// not the caller's to wait for); cutDir is removed when it is not kept.
// It reports whether it took cutDir.
func (h *hotTier) keepAsync(ck meta.Checkpoint, cutDir string) bool {
	if !h.on() || ck.ImageDigest == "" {
		return false
	}
	h.spawn(func() {
		if err := h.keep(ck, cutDir); err != nil {
			h.lg.Warn("hot copy not kept", "checkpoint_id", ck.ID, "err", err)
		}
		_ = os.RemoveAll(cutDir) // gone already when kept
	})
	return true
}

// wait waits for the copies being made.
func (h *hotTier) wait() {
	if h == nil {
		return
	}
	h.fmu.Lock()
	for h.flying > 0 {
		h.landed.Wait()
	}
	h.fmu.Unlock()
}

func (h *hotTier) on() bool { return h != nil && h.limit > 0 }

func (h *hotTier) path(ckID string) string { return filepath.Join(h.dir, ckID) }

// keep makes cutDir, the image of committed checkpoint ck, the hot copy of
// its sandbox (the order above), replacing the sandbox's older copies. It
// consumes cutDir on success.
func (h *hotTier) keep(ck meta.Checkpoint, cutDir string) error {
	if !h.on() || ck.ImageDigest == "" {
		return nil
	}
	_, _, err := h.keepMeta(hotMeta{Checkpoint: ck.ID, Sandbox: ck.SandboxID, ImageDigest: ck.ImageDigest, Kept: time.Now().UTC()}, cutDir, false)
	return err
}

// keepLocal makes cutDir, the image of checkpoint ck cut but not
// uploaded, a pinned hot copy (the order above, before the local commit:
// upload.go), carrying pm, the manifest metadata its upload will record.
// It returns the digest of the copy's hot.json — the integrity record the
// checkpoint's row carries (Checkpoint.HotDigest) — and false, consuming
// nothing, when the tier cannot keep it (off, too big, the disk nearly
// full): then the upload comes before the ack.
func (h *hotTier) keepLocal(ck meta.Checkpoint, cutDir string, pm map[string]string) (digest string, kept bool, err error) {
	if !h.on() {
		return "", false, nil
	}
	return h.keepMeta(hotMeta{Checkpoint: ck.ID, Sandbox: ck.SandboxID, Kept: time.Now().UTC(), Meta: pm}, cutDir, true)
}

// keepMeta is keep and keepLocal: hm names the copy; pin keeps it until
// unpin.
func (h *hotTier) keepMeta(hm hotMeta, cutDir string, pin bool) (digest string, kept bool, err error) {
	ck := meta.Checkpoint{ID: hm.Checkpoint, SandboxID: hm.Sandbox}
	err = filepath.WalkDir(cutDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		serr := f.Sync()
		st, err := f.Stat()
		f.Close()
		if serr != nil {
			return serr
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(cutDir, p)
		hm.Files = append(hm.Files, fileRecord(rel, st))
		hm.Size += st.Size()
		return nil
	})
	if err != nil {
		return "", false, fmt.Errorf("hot copy of %s: %w", ck.ID, err)
	}
	if hm.Size > h.limit {
		return "", false, nil // bigger than the whole tier: cold only
	}
	if !roomFor(cutDir, hm.Size) {
		h.lg.Warn("hot copy not kept: the disk is nearly full", "checkpoint_id", ck.ID, "bytes", hm.Size)
		return "", false, nil
	}
	b, _ := json.Marshal(hm)
	if err := writeSynced(filepath.Join(cutDir, hotMetaName), b); err != nil {
		return "", false, fmt.Errorf("hot copy of %s: %w", ck.ID, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return "", false, err
	}
	dst := h.path(ck.ID)
	_ = os.RemoveAll(dst)
	if err := os.Rename(cutDir, dst); err != nil {
		return "", false, fmt.Errorf("hot copy of %s: %w", ck.ID, err)
	}
	syncDir(h.dir)
	if pin {
		h.pinned[ck.ID] = true
	}
	h.pruneLocked(ck.SandboxID, ck.ID)
	h.evictLocked()
	return recordDigest(b), true, nil
}

// pruneLocked keeps one copy per sandbox, newest (and the pinned ones).
func (h *hotTier) pruneLocked(sandbox, newest string) {
	for _, c := range h.listLocked() {
		if c.Sandbox == sandbox && c.Checkpoint != newest && !h.kept(c.Checkpoint) {
			_ = os.RemoveAll(h.path(c.Checkpoint))
		}
	}
}

// pin keeps checkpoint ckID's copy until unpin (a restart's pending
// uploads: upload.go).
func (h *hotTier) pin(ckID string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.pinned[ckID] = true
	h.mu.Unlock()
}

// kept reports whether checkpoint ckID's copy is pinned or held (h.mu
// held).
func (h *hotTier) kept(ckID string) bool { return h.pinned[ckID] || h.held[ckID] > 0 }

// hold keeps checkpoint ckID's copy until as many unhold (a lazy restore
// loading from it: lazy.go).
func (h *hotTier) hold(ckID string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.held[ckID]++
	h.mu.Unlock()
}

// unhold ends one hold; with none left and not pinned, the copy goes as
// unpin lets it.
func (h *hotTier) unhold(ckID string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[ckID]--; h.held[ckID] <= 0 {
		delete(h.held, ckID)
		h.releaseLocked(ckID)
	}
}

// unpin lets checkpoint ckID's copy go as any other: its upload ended. An
// older copy than the newest of its sandbox goes now.
func (h *hotTier) unpin(ckID string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pinned, ckID)
	h.releaseLocked(ckID)
}

// releaseLocked removes checkpoint ckID's copy if it is neither pinned
// nor held and a newer copy of its sandbox is kept, and evicts to the
// bound (h.mu held).
func (h *hotTier) releaseLocked(ckID string) {
	if h.kept(ckID) {
		h.evictLocked()
		return
	}
	cs := h.listLocked()
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].Checkpoint == ckID {
			for _, c := range cs[i+1:] {
				if c.Sandbox == cs[i].Sandbox {
					_ = os.RemoveAll(h.path(ckID)) // a newer copy of its sandbox is kept
					break
				}
			}
			break
		}
	}
	h.evictLocked()
}

// recordDigest is the digest of a copy's hot.json, its integrity record.
func recordDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func fileRecord(rel string, st os.FileInfo) hotFile {
	hf := hotFile{Path: filepath.ToSlash(rel), Size: st.Size(), MtimeNS: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		hf.Inode = sys.Ino
	}
	return hf
}

// listLocked reads every whole copy's hot.json, oldest first.
func (h *hotTier) listLocked() []hotMeta {
	ents, err := os.ReadDir(h.dir)
	if err != nil {
		return nil
	}
	var out []hotMeta
	for _, e := range ents {
		if hm, err := readHotMeta(h.path(e.Name())); err == nil && hm.Checkpoint == e.Name() {
			out = append(out, hm)
		} else {
			_ = os.RemoveAll(h.path(e.Name())) // not whole: left by a crash
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kept.Before(out[j].Kept) })
	return out
}

// evictLocked removes the oldest copies until the tier fits its bound.
func (h *hotTier) evictLocked() {
	cs := h.listLocked()
	var total int64
	for _, c := range cs {
		total += c.Size
	}
	for i := 0; total > h.limit && i < len(cs); i++ {
		if h.kept(cs[i].Checkpoint) {
			continue
		}
		_ = os.RemoveAll(h.path(cs[i].Checkpoint))
		total -= cs[i].Size
	}
}

func readHotMeta(dir string) (hotMeta, error) {
	hm, _, err := readHotRecord(dir)
	return hm, err
}

// readHotRecord is readHotMeta with the record's digest (recordDigest).
func readHotRecord(dir string) (hotMeta, string, error) {
	var hm hotMeta
	b, err := os.ReadFile(filepath.Join(dir, hotMetaName))
	if err != nil {
		return hm, "", err
	}
	if len(b) > 16<<20 {
		return hm, "", errors.New("hot.json too big")
	}
	err = json.Unmarshal(b, &hm)
	return hm, recordDigest(b), err
}

// errNoHotCopy: the restore is cold.
var errNoHotCopy = errors.New("no hot copy")

// take checks ck's hot copy (see Integrity) and returns a directory of hard
// links to its files in workDir for the driver to restore from, and a
// function that verifies the copy's bytes (to run once the sandbox runs).
//
// entries gives the checkpoint's manifest entries for the byte check.
func (h *hotTier) take(ck meta.Checkpoint, workDir string, entries func() ([]chunkstore.Entry, error)) (dir string, verify func(), err error) {
	if !h.on() {
		return "", nil, errNoHotCopy
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	src := h.path(ck.ID)
	hm, rec, err := readHotRecord(src)
	if err != nil {
		return "", nil, errNoHotCopy
	}
	drop := func(why string) (string, func(), error) {
		h.lg.Warn("hot copy refused; restoring from the chunk store", "checkpoint_id", ck.ID, "why", why)
		_ = os.RemoveAll(src)
		return "", nil, fmt.Errorf("%w: %s", errNoHotCopy, why)
	}
	// A copy kept before its upload is checked against the record its
	// row carries (keepLocal), any other against the image digest.
	if ck.HotDigest != "" && (hm.Checkpoint != ck.ID || rec != ck.HotDigest) {
		return drop(fmt.Sprintf("its record %s is not the checkpoint's %s", rec, ck.HotDigest))
	}
	if ck.HotDigest == "" && (hm.Checkpoint != ck.ID || hm.ImageDigest != ck.ImageDigest) {
		return drop(fmt.Sprintf("it is of %s %s, the checkpoint is %s", hm.Checkpoint, hm.ImageDigest, ck.ImageDigest))
	}
	dir = filepath.Join(workDir, "hot-"+ck.ID+"-"+strings.TrimPrefix(newID(), "sbx-"))
	fail := func(why string) (string, func(), error) {
		_ = os.RemoveAll(dir)
		return drop(why)
	}
	// The directories first, with the copy's modes (what the image's
	// directories are is part of it).
	if err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		q := filepath.Join(dir, rel)
		if err := os.MkdirAll(q, 0o700); err != nil {
			return err
		}
		return os.Chmod(q, info.Mode().Perm()|info.Mode()&(fs.ModeSetgid|fs.ModeSticky))
	}); err != nil {
		return fail(err.Error())
	}
	for _, f := range hm.Files {
		if !fs.ValidPath(f.Path) {
			return fail("a file path outside the copy: " + f.Path)
		}
		p := filepath.Join(src, filepath.FromSlash(f.Path))
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() || fileRecord(f.Path, st) != f {
			return fail(fmt.Sprintf("%s changed since it was kept", f.Path))
		}
		if f.Path == hotMetaName {
			continue
		}
		q := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.Link(p, q); err != nil {
			return fail(err.Error())
		}
	}
	verify = func() {
		es, err := entries()
		if err != nil {
			h.lg.Warn("hot copy not checked: no manifest", "checkpoint_id", ck.ID, "err", err)
			return
		}
		if err := chunkstore.VerifyTreePaced(src, es, verifyBytesPerSec, hotMetaName); err != nil {
			h.lg.Error("hot copy does not match its checkpoint; removed", "checkpoint_id", ck.ID, "sandbox_id", ck.SandboxID, "err", err)
			h.drop(ck.ID)
		}
	}
	return dir, verify, nil
}

// metaOf is checkpoint ckID's copy's manifest metadata (keepLocal; nil if
// it has no copy).
func (h *hotTier) metaOf(ckID string) map[string]string {
	if !h.on() {
		return nil
	}
	hm, err := readHotMeta(h.path(ckID))
	if err != nil || hm.Checkpoint != ckID {
		return nil
	}
	return hm.Meta
}

// drop removes checkpoint ckID's hot copy.
func (h *hotTier) drop(ckID string) {
	if h == nil || ckID == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pinned, ckID)
	_ = os.RemoveAll(h.path(ckID))
}

// has reports whether checkpoint ckID has a whole hot copy (tests, stats).
func (h *hotTier) has(ckID string) bool {
	if !h.on() {
		return false
	}
	hm, err := readHotMeta(h.path(ckID))
	return err == nil && hm.Checkpoint == ckID
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// minFreeShare is the share of its filesystem the hot tier leaves free: a
// copy that would eat into it is not kept (the sandboxes' layers and the
// next cut need the room more).
const minFreeShare = 0.10

// roomFor reports whether n more bytes on dir's filesystem leave
// minFreeShare of it free. The copy is a rename of files already written,
// so it takes no new room; the room counted is what the copy keeps from
// being freed.
func roomFor(dir string, n int64) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return true
	}
	total := float64(st.Blocks) * float64(st.Bsize)
	free := float64(st.Bavail) * float64(st.Bsize)
	return free >= minFreeShare*total
}
