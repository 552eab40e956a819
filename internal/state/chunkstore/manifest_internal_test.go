package chunkstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
)

// commitRaw stores a manifest as Put would, without checks, and commits it.
func commitRaw(t *testing.T, s *Store, m *Manifest) {
	t.Helper()
	keys, err := s.tenantKeys(m.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	plain, digest, err := m.encode()
	if err != nil {
		t.Fatal(err)
	}
	key := manifestKey(m.Tenant, m.Checkpoint, digest)
	ctx := context.Background()
	if err := blob.PutBytes(ctx, s.cfg.Blobs, key, keys.seal(nil, kindManifest, key, plain, nil)); err != nil {
		t.Fatal(err)
	}
	p, _ := json.Marshal(pointer{FormatVersion: FormatVersion, Checkpoint: m.Checkpoint, Manifest: digest})
	if err := blob.PutBytes(ctx, s.cfg.Blobs, pointerKey(m.Tenant, m.Checkpoint), p); err != nil {
		t.Fatal(err)
	}
}

func newTestStore(t *testing.T) *Store {
	s, err := New(Config{Blobs: blobtest.NewMem(), MasterKey: bytes.Repeat([]byte{1}, MasterKeySize)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestManifestFromTheFuture(t *testing.T) {
	s := newTestStore(t)
	m := &Manifest{FormatVersion: FormatVersion + 1, Tenant: "acme", Checkpoint: "ck", Chunker: chunkerName}
	m.ImageDigest = imageDigest(nil)
	commitRaw(t, s, m)
	_, err := s.Manifest(context.Background(), "acme", "ck")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), fmt.Sprintf("format version %d", FormatVersion+1)) {
		t.Fatalf("manifest of a newer format: got %v", err)
	}
}

// A manifest that is authentic but inconsistent (paths escaping the root,
// sizes that do not add up, a wrong image digest) is refused as data loss.
func TestManifestChecks(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	// placed is a one-chunk file stored where c says.
	placed := func(c ChunkRef) Entry {
		c.SHA256, c.Size = sum, 10
		return Entry{Path: "a", Type: TypeFile, Mode: 0o644, Size: 10, SHA256: sum, Chunks: []ChunkRef{c}}
	}
	file := func(p string) Entry {
		return Entry{Path: p, Type: TypeFile, Mode: 0o644, Size: 10, SHA256: sum, Chunks: []ChunkRef{{SHA256: sum, Size: 10}}}
	}
	cases := map[string][]Entry{
		"dotdot":          {file("../evil")},
		"absolute":        {file("/etc/passwd")},
		"unclean":         {file("a/./b")},
		"no parent":       {file("a/b")},
		"symlink parent":  {{Path: "a", Type: TypeSymlink, Target: "/"}, file("a/b")},
		"twice":           {file("a"), file("a")},
		"bad size":        {{Path: "a", Type: TypeFile, Size: 11, SHA256: sum, Chunks: []ChunkRef{{SHA256: sum, Size: 10}}}},
		"huge chunk":      {{Path: "a", Type: TypeFile, Size: MaxChunk + 1, SHA256: sum, Chunks: []ChunkRef{{SHA256: sum, Size: MaxChunk + 1}}}},
		"bad mode":        {{Path: "a", Type: TypeDir, Mode: 0o170000}},
		"unknown type":    {{Path: "a", Type: "fifo"}},
		"bad pack name":   {placed(ChunkRef{Pack: "../../x", Sealed: 100})},
		"negative offset": {placed(ChunkRef{Pack: strings.Repeat("0f", 16), Offset: -1, Sealed: 100})},
		"tiny sealed":     {placed(ChunkRef{Pack: strings.Repeat("0f", 16), Sealed: SealOverhead - 1})},
		"huge sealed":     {placed(ChunkRef{Pack: strings.Repeat("0f", 16), Sealed: MaxChunk + SealOverhead + 2048})},
		"place no pack":   {placed(ChunkRef{Offset: 4096})},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			s := newTestStore(t)
			var size int64
			for _, e := range entries {
				size += e.Size
			}
			m := &Manifest{FormatVersion: FormatVersion, Tenant: "acme", Checkpoint: "ck", Entries: entries, Size: size,
				ImageDigest: imageDigest(entries)}
			commitRaw(t, s, m)
			if _, err := s.Manifest(context.Background(), "acme", "ck"); !errdefs.IsDataLoss(err) {
				t.Fatalf("got %v, want data loss", err)
			}
		})
	}
	t.Run("image digest", func(t *testing.T) {
		s := newTestStore(t)
		m := &Manifest{FormatVersion: FormatVersion, Tenant: "acme", Checkpoint: "ck", Entries: []Entry{file("a")}, Size: 10,
			ImageDigest: imageDigest(nil)}
		commitRaw(t, s, m)
		if _, err := s.Manifest(context.Background(), "acme", "ck"); !errdefs.IsDataLoss(err) {
			t.Fatalf("got %v, want data loss", err)
		}
	})
	t.Run("misplaced", func(t *testing.T) {
		s := newTestStore(t)
		m := &Manifest{FormatVersion: FormatVersion, Tenant: "acme", Checkpoint: "other", ImageDigest: imageDigest(nil)}
		keys, _ := s.tenantKeys("acme")
		plain, digest, _ := m.encode()
		key := manifestKey("acme", "ck", digest)
		_ = blob.PutBytes(context.Background(), s.cfg.Blobs, key, keys.seal(nil, kindManifest, key, plain, nil))
		p, _ := json.Marshal(pointer{FormatVersion: FormatVersion, Checkpoint: "ck", Manifest: digest})
		_ = blob.PutBytes(context.Background(), s.cfg.Blobs, pointerKey("acme", "ck"), p)
		if _, err := s.Manifest(context.Background(), "acme", "ck"); !errdefs.IsDataLoss(err) {
			t.Fatalf("got %v, want data loss", err)
		}
	})
}

func TestSealBindsNameAndKind(t *testing.T) {
	s := newTestStore(t)
	a, _ := s.tenantKeys("a")
	b, _ := s.tenantKeys("b")
	plain := bytes.Repeat([]byte("compressible "), 1000)
	obj := a.seal(nil, kindChunk, "k1", plain, nil)
	if obj[6] != codecZstd {
		t.Fatalf("compressible data stored with codec %d", obj[6])
	}
	if got, err := a.open(kindChunk, "k1", obj, len(plain)); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %v", err)
	}
	for name, fn := range map[string]func() ([]byte, error){
		"other name":   func() ([]byte, error) { return a.open(kindChunk, "k2", obj, len(plain)) },
		"other kind":   func() ([]byte, error) { return a.open(kindManifest, "k1", obj, len(plain)) },
		"other tenant": func() ([]byte, error) { return b.open(kindChunk, "k1", obj, len(plain)) },
		"too large":    func() ([]byte, error) { return a.open(kindChunk, "k1", obj, len(plain)-1) },
		"truncated":    func() ([]byte, error) { return a.open(kindChunk, "k1", obj[:len(obj)-1], len(plain)) },
	} {
		if _, err := fn(); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	if obj := a.seal(nil, kindChunk, "k", randomish(), nil); obj[6] != codecRaw {
		t.Errorf("incompressible data stored with codec %d", obj[6])
	}
}

func randomish() []byte {
	b := make([]byte, 8192)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
