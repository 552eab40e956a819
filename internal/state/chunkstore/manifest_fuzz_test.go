package chunkstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// FuzzDecodeManifest: decodeManifest on any plaintext (under its own
// digest, so the parser and the checks are reached, not just the digest
// comparison) never panics, fails only as data loss or a newer format, and
// whatever it accepts is a manifest Restore may trust: of the tenant and
// checkpoint asked for, every path clean, relative and under a directory
// listed before it, sizes adding up, and re-encoded it decodes to the same.
func FuzzDecodeManifest(f *testing.F) {
	const maxChunk = 1 << 20
	sum := strings.Repeat("ab", 32)
	entries := []Entry{
		{Path: "etc", Type: TypeDir, Mode: 0o755},
		{Path: "etc/hosts", Type: TypeFile, Mode: 0o644, Size: 10, SHA256: sum, Chunks: []ChunkRef{{SHA256: sum, Size: 4}, {SHA256: sum, Size: 6}}},
		{Path: "etc/link", Type: TypeSymlink, Mode: 0o777, Target: "../../../host"},
	}
	good := Manifest{FormatVersion: 1, Tenant: "acme", Checkpoint: "ckpt-1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Chunker: "fastcdc-v1", Entries: entries, Size: 10, ImageDigest: imageDigest(entries)}
	b, _, _ := good.encode()
	f.Add(b)
	for _, bad := range []string{
		`{"format_version":1,"tenant":"acme","checkpoint":"ckpt-1","entries":[{"path":"../x","type":"dir"}]}`,
		`{"format_version":1,"tenant":"acme","checkpoint":"ckpt-1","entries":[{"path":"/etc","type":"dir"}]}`,
		`{"format_version":1,"tenant":"acme","checkpoint":"ckpt-1","entries":[{"path":"a","type":"dir"},{"path":"a","type":"dir"}]}`,
		`{"format_version":1,"tenant":"acme","checkpoint":"ckpt-1","entries":[{"path":"a/b","type":"file","size":-1}]}`,
		`{"format_version":2,"tenant":"acme","checkpoint":"ckpt-1"}`,
		`{"format_version":1,"tenant":"globex","checkpoint":"ckpt-1"}`,
		`{"format_version":1e400}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(bad))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeAndCheck(t, b, maxChunk)
		// The same input with its digests and totals made consistent, so
		// the structural checks (paths, parents, types, chunks) decide.
		var m Manifest
		if json.Unmarshal(b, &m) != nil {
			return
		}
		m.Tenant, m.Checkpoint, m.Size = "acme", "ckpt-1", 0
		for i := range m.Entries {
			if m.Entries[i].Type == TypeFile {
				var n int64
				for _, c := range m.Entries[i].Chunks {
					n += c.Size
				}
				m.Entries[i].Size = n
				m.Size += n
			}
		}
		m.ImageDigest = imageDigest(m.Entries)
		if fixed, _, err := m.encode(); err == nil {
			decodeAndCheck(t, fixed, maxChunk)
		}
	})
}

// decodeAndCheck decodes b under its own digest and checks what the
// decoder accepted.
func decodeAndCheck(t *testing.T, b []byte, maxChunk int64) {
	d := sha256.Sum256(b)
	digest := hex.EncodeToString(d[:])
	m, err := decodeManifest(b, "acme", "ckpt-1", digest, maxChunk)
	if err != nil {
		if !errdefs.IsDataLoss(err) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("error of kind %s: %v", errdefs.Kind(err), err)
		}
		return
	}
	if m.Tenant != "acme" || m.Checkpoint != "ckpt-1" || m.FormatVersion < 1 || m.FormatVersion > FormatVersion {
		t.Fatalf("accepted a manifest of %s/%s, version %d", m.Tenant, m.Checkpoint, m.FormatVersion)
	}
	dirs := map[string]bool{".": true}
	var total int64
	for _, e := range m.Entries {
		if path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == ".." || strings.HasPrefix(e.Path, "../") || !dirs[path.Dir(e.Path)] {
			t.Fatalf("accepted entry path %q", e.Path)
		}
		if e.Type == TypeDir {
			dirs[e.Path] = true
		}
		if e.Type == TypeFile {
			if e.Size < 0 {
				t.Fatalf("accepted size %d", e.Size)
			}
			total += e.Size
		}
	}
	if total != m.Size {
		t.Fatalf("accepted files of %d bytes as %d", total, m.Size)
	}
	enc, d2, err := m.encode()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := decodeManifest(enc, "acme", "ckpt-1", d2, maxChunk)
	if err != nil {
		t.Fatalf("re-encoded manifest refused: %v", err)
	}
	if !reflect.DeepEqual(m.Entries, m2.Entries) || m.Size != m2.Size || m.ImageDigest != m2.ImageDigest {
		t.Fatalf("re-encoded manifest decodes differently")
	}
}
