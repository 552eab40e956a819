package chunkstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/stores/s3/miniotest"
)

// A checkpoint's new chunks are written as packs of about PackSize bytes,
// and a restore reads them with a few ranged reads, not one per chunk: the
// cold restore from MinIO paid one GET per chunk.
func TestPacksAreFewReads(t *testing.T) {
	for _, b := range []backend{localBackend(), minioBackend(t)} {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b)
			root := filepath.Join(t.TempDir(), "image")
			data := writeRandom(t, filepath.Join(root, "pages-1.img"), 3, 16<<20)
			must(t, os.WriteFile(filepath.Join(root, "zeros.img"), make([]byte, 4<<20), 0o600))
			r1 := e.put("acme", "ck1", root, chunkstore.PutOptions{})
			if n := len(e.keys("tenants/acme/chunks/")); n != 0 {
				t.Fatalf("%d chunk objects: new chunks must go into packs", n)
			}
			packs := len(e.keys("tenants/acme/packs/"))
			if packs < 4 || packs > 6 {
				t.Fatalf("%d packs for 16 MiB of random data and 4 MiB packs", packs)
			}
			res := e.restoreEqual(e.store, "acme", "ck1", root)
			// One read per pack, give or take the runs a read's bound
			// splits, and the zero chunks (one chunk, read once).
			if res.Fetched > 2*packs+2 {
				t.Fatalf("restore made %d reads for %d chunks in %d packs", res.Fetched, res.Chunks, packs)
			}
			t.Logf("ck1: %d chunks (%d new) in %d packs, restored with %d reads", r1.Chunks, r1.NewChunks, packs, res.Fetched)

			// A second checkpoint after a change stores the new chunks in
			// a new pack and reads the rest where ck1 put them.
			copy(data[8<<20:], randBytes(4, 256<<10))
			must(t, os.WriteFile(filepath.Join(root, "pages-1.img"), data, 0o600))
			r2 := e.put("acme", "ck2", root, chunkstore.PutOptions{Parent: "ck1"})
			if got := len(e.keys("tenants/acme/packs/")); got != packs+1 || r2.NewChunks == 0 || r2.NewChunks > 6 {
				t.Fatalf("ck2: %d new chunks, %d packs (ck1 had %d)", r2.NewChunks, got, packs)
			}
			res = e.restoreEqual(e.store, "acme", "ck2", root)
			if res.Fetched > 2*packs+6 {
				t.Fatalf("restore of ck2 made %d reads", res.Fetched)
			}
			// ck1 deleted: the packs ck2 still uses stay whole.
			gc, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck1")
			if err != nil || gc.Deferred || gc.DeletedPacks != 0 {
				t.Fatalf("delete ck1: %+v, %v; want every pack kept", gc, err)
			}
			e.restoreEqual(e.store, "acme", "ck2", root)
			assertOnlyReferenced(t, e, "acme")
		})
	}
}

// Checkpoints written one chunk per object (format 1, before packs) stay
// readable, and a packed child of such a parent references the parent's
// chunk objects instead of copying them.
func TestPackedChildOfPerChunkParent(t *testing.T) {
	e := newEnv(t, perChunk(localBackend()))
	root1 := filepath.Join(t.TempDir(), "image")
	data := writeRandom(t, filepath.Join(root1, "mem.img"), 9, 4<<20)
	e.put("acme", "ck1", root1, chunkstore.PutOptions{})
	oldChunks := len(e.keys("tenants/acme/chunks/"))

	cfg := e.cfg
	cfg.PackSize = 0 // the default: packs
	packed, err := chunkstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	copy(data[1<<20:], randBytes(10, 128<<10))
	root := filepath.Join(t.TempDir(), "image")
	writeFile(t, filepath.Join(root, "mem.img"), data)
	r2, err := packed.Put(ctx(t), "acme", "ck2", root, chunkstore.PutOptions{Parent: "ck1"})
	if err != nil {
		t.Fatal(err)
	}
	if r2.NewChunks == 0 || r2.NewChunks > 4 || len(e.keys("tenants/acme/packs/")) != 1 {
		t.Fatalf("ck2 wrote %d chunks into %d packs", r2.NewChunks, len(e.keys("tenants/acme/packs/")))
	}
	m, err := packed.Manifest(ctx(t), "acme", "ck2")
	if err != nil || m.FormatVersion != chunkstore.FormatVersion {
		t.Fatalf("manifest: %+v, %v", m, err)
	}
	var inPacks, own int
	for _, c := range m.Entries[len(m.Entries)-1].Chunks {
		if c.Pack != "" {
			inPacks++
		} else {
			own++
		}
	}
	if inPacks != r2.NewChunks || own == 0 {
		t.Fatalf("ck2's chunks: %d in packs, %d their own objects; want %d new in packs and the rest ck1's", inPacks, own, r2.NewChunks)
	}
	// Both stores read both checkpoints.
	e.restoreEqual(packed, "acme", "ck1", root1)
	e.restoreEqual(e.store, "acme", "ck2", root)
	// Deleting ck1 keeps the chunk objects ck2 references.
	if _, err := packed.DeleteCheckpoint(ctx(t), "acme", "ck1"); err != nil {
		t.Fatal(err)
	}
	if left := len(e.keys("tenants/acme/chunks/")); left == 0 || left >= oldChunks {
		t.Fatalf("%d of ck1's %d chunk objects left: want those ck2 uses", left, oldChunks)
	}
	e.restoreEqual(packed, "acme", "ck2", root)
	assertOnlyReferenced(t, e, "acme")
}

// BenchmarkRestoreMinIO: a cold restore's read path (Restore into a new
// directory) of a 64 MiB image from a real MinIO on this machine, packed and
// one object per chunk.
//
//	go test -run '^$' -bench BenchmarkRestoreMinIO -benchtime 5x ./internal/state/chunkstore
func BenchmarkRestoreMinIO(b *testing.B) {
	srv := miniotest.Start(b)
	const size = 64 << 20
	root := benchTree(b, imageData(1, size))
	for _, layout := range []struct {
		name     string
		packSize int
	}{{"packed", 0}, {"per-chunk", -1}} {
		b.Run(layout.name, func(b *testing.B) {
			s, err := chunkstore.New(chunkstore.Config{Blobs: srv.Store(b), MasterKey: masterKey, PackSize: layout.packSize,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			put, err := s.Put(context.Background(), "bench", "ck", root, chunkstore.PutOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			var reads int
			b.ResetTimer()
			dir := b.TempDir()
			for b.Loop() {
				dst := filepath.Join(dir, "restored")
				res, err := s.Restore(context.Background(), "bench", "ck", dst, chunkstore.RestoreOptions{})
				if err != nil {
					b.Fatal(err)
				}
				reads = res.Fetched
				b.StopTimer()
				must(b, os.RemoveAll(dst))
				b.StartTimer()
			}
			b.ReportMetric(float64(reads), "reads/op")
			b.ReportMetric(put.Duration.Seconds()*1000, "put-ms")
		})
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, data, 0o644))
}

// A file Unchanged says is its parent's (a layer blob) is described from
// the parent's manifest without a byte read; one whose size differs, or
// that Unchanged does not name, is read as always.
func TestPutUnchangedFilesFromParent(t *testing.T) {
	e := newEnv(t, localBackend())
	root := filepath.Join(t.TempDir(), "image")
	blob := filepath.Join(root, "layer-blobs", "k1")
	b1 := writeRandom(t, blob, 20, 8<<20)
	writeRandom(t, filepath.Join(root, "mem.img"), 21, 1<<20)
	e.put("acme", "ck1", root, chunkstore.PutOptions{})
	// Other bytes of the same size under the blob's name: a Put told the
	// blob is unchanged does not read it, so ck2 describes ck1's bytes.
	writeRandom(t, blob, 22, 8<<20)
	isBlob := func(p string) bool { return strings.HasPrefix(p, "layer-blobs/") }
	r2 := e.put("acme", "ck2", root, chunkstore.PutOptions{Parent: "ck1", Unchanged: isBlob})
	if r2.ReusedFiles != 1 || r2.NewChunks != 0 {
		t.Fatalf("reused %d files, %d new chunks; want the blob reused, nothing written", r2.ReusedFiles, r2.NewChunks)
	}
	dst := filepath.Join(t.TempDir(), "ck2")
	if _, err := e.store.Restore(ctx(t), "acme", "ck2", dst, chunkstore.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "layer-blobs", "k1")); !bytes.Equal(got, b1) {
		t.Fatal("ck2's blob is not ck1's bytes: the Put read the file")
	}
	// Without the hint, or with a size that differs, the file is read.
	r3 := e.put("acme", "ck3", root, chunkstore.PutOptions{Parent: "ck2"})
	if r3.ReusedFiles != 0 || r3.NewChunks == 0 {
		t.Fatalf("without Unchanged: reused %d files, %d new chunks", r3.ReusedFiles, r3.NewChunks)
	}
	e.restoreEqual(e.store, "acme", "ck3", root)
	writeRandom(t, blob, 23, 8<<20+1)
	r4 := e.put("acme", "ck4", root, chunkstore.PutOptions{Parent: "ck3", Unchanged: isBlob})
	if r4.ReusedFiles != 0 || r4.NewChunks == 0 {
		t.Fatalf("a blob of another size: reused %d, new chunks %d", r4.ReusedFiles, r4.NewChunks)
	}
	e.restoreEqual(e.store, "acme", "ck4", root)
}
