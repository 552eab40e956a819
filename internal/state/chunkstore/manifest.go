package chunkstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// FormatVersion is the manifest format this package writes. Restore refuses
// (errdefs.ErrFailedPrecondition) manifests of a newer version than it knows.
// Version 2 added chunk locations in packs (ChunkRef.Pack); version 1
// manifests (every chunk its own object) are still read.
const FormatVersion = 2

// pointerVersion is the COMMITTED object's format (unchanged by version 2).
const pointerVersion = 1

// Entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
)

// Manifest describes one checkpoint image. It is stored sealed; its digest
// (SHA-256 of its JSON encoding) is what the commit pointer names.
type Manifest struct {
	FormatVersion int       `json:"format_version"`
	Tenant        string    `json:"tenant"`
	Checkpoint    string    `json:"checkpoint"`
	CreatedAt     time.Time `json:"created_at"`
	// Meta is the caller's (PutOptions.Meta): e.g. the log position the
	// checkpoint is a cut of, the sandbox, the driver.
	Meta map[string]string `json:"meta,omitempty"`
	// Chunker names the chunking parameters (dedup happens only between
	// checkpoints chunked alike).
	Chunker string  `json:"chunker"`
	Entries []Entry `json:"entries"`
	// Size is the total size of the regular files.
	Size int64 `json:"size"`
	// ImageDigest is "sha256:<hex>" over every entry's type, path, mode,
	// size, content digest and link target, in manifest order.
	ImageDigest string `json:"image_digest"`
}

// Entry is one file, directory or symlink of the image.
type Entry struct {
	// Path is relative to the image root, "/"-separated and clean; an
	// entry's parent directory is listed before it.
	Path string `json:"path"`
	Type string `json:"type"`
	// Mode holds the permission bits (including setuid, setgid, sticky).
	Mode uint32 `json:"mode"`
	// Size and SHA256 (hex) describe a regular file's content.
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
	// Chunks are a file's content in order.
	Chunks []ChunkRef `json:"chunks,omitempty"`
}

// ChunkRef is one chunk of a file: its plaintext SHA-256 (hex) and size,
// and where its sealed bytes are: Sealed bytes at Offset of pack Pack, or,
// with no Pack, the chunk's own object (format 1 and Config.PackSize < 0).
type ChunkRef struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Pack   string `json:"pack,omitempty"`
	Offset int64  `json:"off,omitempty"`
	Sealed int64  `json:"len,omitempty"`
}

// imageDigest computes Manifest.ImageDigest over entries.
func imageDigest(entries []Entry) string {
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%s\x00%o\x00%d\x00%s\x00%s\n", e.Type, e.Path, e.Mode, e.Size, e.SHA256, e.Target)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// encode returns the manifest's JSON and its digest (hex SHA-256).
func (m *Manifest) encode() ([]byte, string, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:]), nil
}

// decodeManifest parses and checks a manifest whose plaintext was read for
// (tenant, id) under digest.
func decodeManifest(b []byte, tenant, id, digest string, maxChunk int64) (*Manifest, error) {
	where := fmt.Sprintf("checkpoint %s/%s: manifest %s", tenant, id, short(digest))
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != digest {
		return nil, errdefs.DataLossf("%s: content does not match its digest", where)
	}
	var probe struct {
		FormatVersion int `json:"format_version"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, errdefs.DataLossf("%s: %v", where, err)
	}
	if probe.FormatVersion > FormatVersion || probe.FormatVersion < 1 {
		return nil, errdefs.FailedPreconditionf("%s: format version %d; this build reads up to %d",
			where, probe.FormatVersion, FormatVersion)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errdefs.DataLossf("%s: %v", where, err)
	}
	if m.Tenant != tenant || m.Checkpoint != id {
		return nil, errdefs.DataLossf("%s: describes %s/%s", where, m.Tenant, m.Checkpoint)
	}
	if err := m.check(maxChunk); err != nil {
		return nil, errdefs.DataLossf("%s: %v", where, err)
	}
	return &m, nil
}

// check validates the manifest's structure: paths are clean, relative and
// under a directory entry listed before them; sizes add up; the image digest
// matches the entries.
func (m *Manifest) check(maxChunk int64) error {
	dirs := map[string]bool{".": true}
	seen := map[string]bool{}
	var total int64
	for _, e := range m.Entries {
		p := e.Path
		if p == "" || p == "." || path.Clean(p) != p || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
			return fmt.Errorf("entry %q: bad path", p)
		}
		if seen[p] {
			return fmt.Errorf("entry %q: listed twice", p)
		}
		seen[p] = true
		if !dirs[path.Dir(p)] {
			return fmt.Errorf("entry %q: parent is not a directory listed before it", p)
		}
		if e.Mode&^0o7777 != 0 {
			return fmt.Errorf("entry %q: bad mode %o", p, e.Mode)
		}
		switch e.Type {
		case TypeDir:
			dirs[p] = true
		case TypeSymlink:
			if e.Target == "" {
				return fmt.Errorf("entry %q: symlink without target", p)
			}
		case TypeFile:
			var sum int64
			for i, c := range e.Chunks {
				if c.Size <= 0 || c.Size > maxChunk || !isHex64(c.SHA256) {
					return fmt.Errorf("entry %q: chunk #%d: bad size or digest", p, i)
				}
				if err := c.checkPlace(maxChunk); err != nil {
					return fmt.Errorf("entry %q: chunk #%d: %v", p, i, err)
				}
				sum += c.Size
			}
			if sum != e.Size || !isHex64(e.SHA256) {
				return fmt.Errorf("entry %q: chunks add up to %d bytes, size is %d", p, sum, e.Size)
			}
			total += e.Size
		default:
			return fmt.Errorf("entry %q: unknown type %q", p, e.Type)
		}
	}
	if total != m.Size {
		return fmt.Errorf("files add up to %d bytes, size is %d", total, m.Size)
	}
	if imageDigest(m.Entries) != m.ImageDigest {
		return fmt.Errorf("image digest does not match the entries")
	}
	return nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

// pointer is the content of a COMMITTED object.
type pointer struct {
	FormatVersion int       `json:"format_version"`
	Checkpoint    string    `json:"checkpoint"`
	Manifest      string    `json:"manifest"`
	CommittedAt   time.Time `json:"committed_at"`
}

// VerifyTree checks that the regular files of the tree at dir are exactly
// the regular-file entries of a manifest, each with its size and content
// digest (reading every byte); top-level names in skip are left out. It is
// how a copy of an image kept outside the store is checked against its
// checkpoint. Modes and owners are not compared: a driver may change them
// on the copy it restores from.
func VerifyTree(dir string, entries []Entry, skip ...string) error {
	return VerifyTreePaced(dir, entries, 0, skip...)
}

// VerifyTreePaced is VerifyTree reading at most bytesPerSec (0: no bound),
// for a check that runs beside the sandboxes rather than before one.
func VerifyTreePaced(dir string, entries []Entry, bytesPerSec int64, skip ...string) error {
	want := map[string]Entry{}
	for _, e := range entries {
		if e.Type == TypeFile {
			want[e.Path] = e
		}
	}
	got, _, err := scanTree(dir)
	if err != nil {
		return err
	}
	n := 0
	for _, g := range got {
		top, _, _ := strings.Cut(g.Path, "/")
		if g.Type != TypeFile || slices.Contains(skip, top) {
			continue
		}
		w, ok := want[g.Path]
		if !ok {
			return errdefs.DataLossf("%s: not in the checkpoint's image", g.Path)
		}
		if g.Size != w.Size {
			return errdefs.DataLossf("%s: %d bytes, the image has %d", g.Path, g.Size, w.Size)
		}
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(g.Path)))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, &pacedReader{r: f, rate: bytesPerSec, start: time.Now()})
		f.Close()
		if err != nil {
			return err
		}
		if sum := hex.EncodeToString(h.Sum(nil)); sum != w.SHA256 {
			return errdefs.DataLossf("%s: content sha256 %s, the image has %s", g.Path, sum, w.SHA256)
		}
		n++
	}
	if n != len(want) {
		return errdefs.DataLossf("%d of the image's %d files are there", n, len(want))
	}
	return nil
}

// pacedReader reads from r at most rate bytes a second on average.
type pacedReader struct {
	r     io.Reader
	rate  int64
	start time.Time
	n     int64
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.rate > 0 {
		if len(b) > 1<<20 {
			b = b[:1<<20]
		}
		if ahead := time.Duration(float64(p.n)/float64(p.rate)*float64(time.Second)) - time.Since(p.start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	return n, err
}
