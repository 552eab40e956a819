package chunkstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/chunkstore"
)

type scenario struct {
	name string
	fn   func(t *testing.T, b backend)
}

// scenarios run against every backend; the ones marked local run only on
// localfs (they test logic that does not depend on the backend).
var (
	scenarios = []scenario{
		{"RoundTrip", testRoundTrip},
		{"Incremental", testIncremental},
		{"CrossTenant", testCrossTenant},
		{"CorruptChunk", testCorruptChunk},
		{"TornCommit", testTornCommit},
		{"GCConcurrentCheckpoint", testGCConcurrentCheckpoint},
		{"WriterWaitsForGC", testWriterWaitsForGC},
		{"DeleteCheckpointAndTenant", testDeleteCheckpointAndTenant},
	}
	localScenarios = []scenario{
		{"CommitHook", testCommitHook},
		{"StaleMarkers", testStaleMarkers},
		{"LostMarker", testLostMarker},
		{"ConcurrentGC", testConcurrentGC},
		{"StalledCollector", testStalledCollector},
		{"DeadCollector", testDeadCollector},
		{"DeadHolder", testDeadHolder},
		{"Progress", testProgress},
		{"Validation", testValidation},
		{"MissingAndMovedObjects", testMissingAndMovedObjects},
	}
)

func TestLocalFS(t *testing.T) {
	for _, sc := range append(slices.Clone(scenarios), localScenarios...) {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, localBackend()) })
	}
}

// TestLocalFSPerChunk runs the scenarios over the layout of format 1 (every
// chunk its own object), which Restore and GC still read.
func TestLocalFSPerChunk(t *testing.T) {
	for _, sc := range append(slices.Clone(scenarios), localScenarios...) {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, perChunk(localBackend())) })
	}
}

func TestMinIO(t *testing.T) {
	b := minioBackend(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, b) })
	}
}

func testRoundTrip(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 1)
	res := e.put("acme", "ck1", src, chunkstore.PutOptions{Meta: map[string]string{"seq": "42"}})
	if !res.Published || res.ID != "ck1" || res.Files != 5 || res.NewChunks == 0 {
		t.Fatalf("put result %+v", res)
	}
	// The 2 MiB of zeros are 32 identical 64 KiB chunks: stored once.
	if res.NewChunks >= res.Chunks-30 {
		t.Errorf("%d new chunks of %d references: zero chunks not deduplicated", res.NewChunks, res.Chunks)
	}
	r := e.restoreEqual(e.store, "acme", "ck1", src)
	if r.Manifest.Meta["seq"] != "42" || r.Manifest.FormatVersion != chunkstore.FormatVersion {
		t.Fatalf("manifest %+v", r.Manifest)
	}
	if r.Fetched >= r.Chunks-30 {
		t.Errorf("restore fetched %d objects for %d chunks: repeats not shared", r.Fetched, r.Chunks)
	}
	// A fresh process (new Store) restores it too, and Verify agrees.
	if _, err := e.reopen(nil).Verify(ctx(t), "acme", "ck1", chunkstore.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	infos, err := e.store.List(ctx(t), "acme")
	if err != nil || len(infos) != 1 || infos[0].ID != "ck1" || infos[0].ManifestDigest != res.ManifestDigest {
		t.Fatalf("list = %+v, %v", infos, err)
	}
	// Nothing but chunks, the manifest and the pointer is left behind.
	for _, k := range e.keys("") {
		if !strings.Contains(k, "/chunks/") && !strings.Contains(k, "/packs/") && !strings.Contains(k, "/checkpoints/ck1/") {
			t.Errorf("unexpected object %s after put", k)
		}
	}
}

// The target: a second checkpoint after a small change stores at
// most 1.5 × the changed bytes + 1 MiB.
func testIncremental(t *testing.T, b backend) {
	e := newEnv(t, b)
	root := filepath.Join(t.TempDir(), "image")
	const size, changed = 64 << 20, 100 << 10
	data := writeRandom(t, filepath.Join(root, "pages-1.img"), 7, size)
	writeRandom(t, filepath.Join(root, "fs.tar"), 8, 1<<20)
	r1 := e.put("acme", "ck1", root, chunkstore.PutOptions{})
	after1 := e.storedBytes("")
	if r1.StoredBytes != after1 {
		t.Errorf("first put reports %d stored bytes, the store holds %d", r1.StoredBytes, after1)
	}
	off := size/2 - changed/2
	copy(data[off:off+changed], randBytes(99, changed))
	must(t, os.WriteFile(filepath.Join(root, "pages-1.img"), data, 0o644))

	r2 := e.put("acme", "ck2", root, chunkstore.PutOptions{Parent: "ck1"})
	delta := e.storedBytes("") - after1
	limit := int64(1.5*changed) + 1<<20
	t.Logf("first checkpoint: %d bytes stored for %d bytes of files; second after a %d-byte change: %d bytes (%d new chunks of %d), limit %d",
		after1, r1.Size, changed, delta, r2.NewChunks, r2.Chunks, limit)
	if delta > limit {
		t.Fatalf("second checkpoint stored %d bytes, more than 1.5 × %d + 1 MiB = %d", delta, changed, limit)
	}
	if r2.StoredBytes != delta {
		t.Errorf("second put reports %d stored bytes, the store grew by %d", r2.StoredBytes, delta)
	}
	if e.packed() {
		// With packs, the parent's manifest is what finds stored chunks:
		// a third checkpoint with no change writes none.
		r3 := e.put("acme", "ck3", root, chunkstore.PutOptions{Parent: "ck2"})
		if r3.NewChunks != 0 {
			t.Errorf("third put (no change) wrote %d chunks", r3.NewChunks)
		}
		e.restoreEqual(e.store, "acme", "ck3", root)
	} else {
		// Without Parent (or with one that is gone) each chunk object is
		// found by lookup: same result.
		r3 := e.put("acme", "ck3", root, chunkstore.PutOptions{Parent: "deleted-long-ago"})
		if r3.NewChunks != 0 {
			t.Errorf("third put (no change) wrote %d chunks", r3.NewChunks)
		}
	}
	e.restoreEqual(e.store, "acme", "ck2", root)
}

func testCrossTenant(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 3)
	ra := e.put("alpha", "ck", src, chunkstore.PutOptions{})
	rb := e.put("beta", "ck", src, chunkstore.PutOptions{})
	// Each tenant stores its own chunks (their boundaries differ too: the
	// chunking polynomial is per tenant).
	if ra.NewChunks == 0 || rb.NewChunks == 0 {
		t.Fatalf("tenants stored %d and %d chunks: each must store its own", ra.NewChunks, rb.NewChunks)
	}
	names := func(tenant string) map[string]bool {
		m := map[string]bool{}
		for _, k := range e.dataKeys(tenant) {
			m[filepath.Base(k)] = true
		}
		return m
	}
	na, nb := names("alpha"), names("beta")
	for n := range na {
		if nb[n] {
			t.Fatalf("chunk name %s is shared by two tenants", n)
		}
	}
	// Nothing outside tenants/<t>/ holds data.
	for _, k := range e.keys("") {
		if !strings.HasPrefix(k, "tenants/alpha/") && !strings.HasPrefix(k, "tenants/beta/") {
			t.Fatalf("object %s outside the tenants' prefixes", k)
		}
	}
	// Sealed bytes differ too (no object of one tenant equals one of the
	// other), and the plaintext is not visible in them.
	sealed := map[string]string{}
	for _, k := range e.dataKeys("alpha") {
		obj, _ := blob.ReadAll(context.Background(), e.blobs, k, 1<<30)
		sealed[string(obj)] = k
	}
	for _, k := range e.dataKeys("beta") {
		obj, _ := blob.ReadAll(context.Background(), e.blobs, k, 1<<30)
		if other, ok := sealed[string(obj)]; ok {
			t.Fatalf("sealed objects %s and %s are equal", other, k)
		}
	}
	plain, _ := os.ReadFile(filepath.Join(src, "pages-1.img"))
	for obj, k := range sealed {
		if strings.Contains(obj, string(plain[:64])) {
			t.Fatalf("plaintext visible in stored chunk %s", k)
		}
	}
	// Tenant beta cannot restore alpha's checkpoint by naming it, and both
	// restore their own.
	if _, err := e.store.Restore(ctx(t), "beta", "nope", filepath.Join(t.TempDir(), "x"), chunkstore.RestoreOptions{}); !errdefs.IsNotFound(err) {
		t.Fatalf("restore of a missing checkpoint: %v", err)
	}
	e.restoreEqual(e.store, "alpha", "ck", src)
	e.restoreEqual(e.store, "beta", "ck", src)
}

func testCorruptChunk(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 4)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	m, err := e.store.Manifest(ctx(t), "acme", "ck1")
	if err != nil {
		t.Fatal(err)
	}
	// Corrupt the stored object of the file's second chunk.
	var file *chunkstore.Entry
	for i := range m.Entries {
		if m.Entries[i].Path == "pages-1.img" {
			file = &m.Entries[i]
		}
	}
	key, off, n := chunkstore.ChunkPlace(e.store, "acme", file.Chunks[1])
	if n > 0 {
		off += n / 2
	}
	e.corruptAt(key, off)

	dst := filepath.Join(t.TempDir(), "restored")
	_, err = e.store.Restore(ctx(t), "acme", "ck1", dst, chunkstore.RestoreOptions{})
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("restore of a corrupted chunk: got %v, want data loss", err)
	}
	for _, want := range []string{`file "pages-1.img"`, "chunk #1", key, file.Chunks[1].SHA256} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Fatalf("a failed restore left %s: %v", dst, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 0 {
		t.Fatalf("a failed restore left %v", ents)
	}
	if _, err := e.store.Verify(ctx(t), "acme", "ck1", chunkstore.RestoreOptions{}); !errdefs.IsDataLoss(err) {
		t.Fatalf("verify of a corrupted chunk: got %v", err)
	}
	// A damaged manifest is data loss too.
	e.corrupt(e.keys("tenants/acme/checkpoints/ck1/manifest.")[0])
	if _, err := e.store.Restore(ctx(t), "acme", "ck1", dst, chunkstore.RestoreOptions{}); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "manifest") {
		t.Fatalf("restore with a corrupted manifest: got %v", err)
	}
}

func testMissingAndMovedObjects(t *testing.T, b backend) {
	e := newEnv(t, b, smallPacks)
	src := sampleTree(t, 5)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	keys := e.dataKeys("acme")
	// A chunk object moved to another chunk's name fails authentication.
	obj0, _ := blob.ReadAll(context.Background(), e.blobs, keys[0], 1<<30)
	obj1, _ := blob.ReadAll(context.Background(), e.blobs, keys[1], 1<<30)
	must(t, blob.PutBytes(context.Background(), e.blobs, keys[1], obj0))
	_, err := e.store.Verify(ctx(t), "acme", "ck1", chunkstore.RestoreOptions{})
	// (A pack moved over a longer one may also end before a chunk does.)
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "authentication") && !strings.Contains(err.Error(), "shorter") {
		t.Fatalf("verify with a swapped chunk: got %v", err)
	}
	// Restore, which does not hash the plaintext, refuses it as well: the
	// seal names the chunk.
	dst := filepath.Join(t.TempDir(), "restored")
	if _, err := e.store.Restore(ctx(t), "acme", "ck1", dst, chunkstore.RestoreOptions{}); !errdefs.IsDataLoss(err) {
		t.Fatalf("restore with a swapped chunk: got %v", err)
	}
	must(t, blob.PutBytes(context.Background(), e.blobs, keys[1], obj1))
	// A missing chunk names itself as missing.
	must(t, e.blobs.Delete(context.Background(), keys[0]))
	_, err = e.store.Verify(ctx(t), "acme", "ck1", chunkstore.RestoreOptions{})
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), keys[0]) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("verify with a missing chunk: got %v", err)
	}
	// A chunk of another tenant copied in fails too.
	must(t, blob.PutBytes(context.Background(), e.blobs, keys[0], obj0))
	e.put("other", "ck1", src, chunkstore.PutOptions{})
	for _, k := range e.dataKeys("other") {
		obj, _ := blob.ReadAll(context.Background(), e.blobs, k, 1<<30)
		must(t, blob.PutBytes(context.Background(), e.blobs, strings.Replace(k, "/other/", "/acme/", 1), obj))
	}
	if _, err := e.store.Verify(ctx(t), "acme", "ck1", chunkstore.RestoreOptions{}); err != nil {
		// The copied objects have other names: acme's own are untouched.
		t.Fatalf("verify after copying another tenant's chunks beside: %v", err)
	}
}

// A checkpoint interrupted at any step is never visible, never damages the
// earlier one, and a retry succeeds; GC then removes exactly the debris.
func testTornCommit(t *testing.T, b backend) {
	isChunkPut := isDataPut
	isManifestPut := func(op blobtest.Op, key string) bool {
		return op == blobtest.OpPut && strings.Contains(key, "/manifest.")
	}
	isPointerPut := func(op blobtest.Op, key string) bool {
		return op == blobtest.OpPutIfAbsent && strings.HasSuffix(key, "/COMMITTED")
	}
	cases := []struct {
		name    string
		fault   blobtest.Fault // a crash of the store client
		failAt  string         // or a failpoint
		visible bool           // the checkpoint is committed despite the error
	}{
		{name: "before-any-chunk", fault: blobtest.CrashAfter(0, isChunkPut)},
		{name: "after-1-chunk", fault: blobtest.CrashAfter(1, isChunkPut)},
		{name: "after-5-chunks", fault: blobtest.CrashAfter(5, isChunkPut)},
		{name: "chunks-durable", failAt: "chunks"},
		{name: "manifest-put", fault: blobtest.CrashAfter(0, isManifestPut)},
		{name: "after-manifest", failAt: "manifest"},
		{name: "before-pointer", failAt: "publish"},
		{name: "pointer-put", fault: blobtest.CrashAfter(0, isPointerPut)},
		{name: "after-pointer", failAt: "committed", visible: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, b, smallPacks)
			src1 := sampleTree(t, 10)
			e.put("acme", "ck1", src1, chunkstore.PutOptions{})
			ck1Objects := e.keys("")

			src2 := sampleTree(t, 11) // different content: new chunks
			s := e.reopen(nil)
			if tc.failAt != "" {
				s = e.reopen(func(step string) error {
					if step == tc.failAt {
						return blobtest.ErrInjected
					}
					return nil
				})
			}
			e.faulty.SetFault(tc.fault)
			_, err := s.Put(ctx(t), "acme", "ck2", src2, chunkstore.PutOptions{})
			e.faulty.SetFault(nil)
			if !errors.Is(err, blobtest.ErrInjected) {
				t.Fatalf("interrupted put: got %v, want the injected failure", err)
			}
			_, statErr := e.store.Stat(ctx(t), "acme", "ck2")
			if tc.visible {
				if statErr != nil {
					t.Fatalf("crash after the pointer: checkpoint not visible: %v", statErr)
				}
				e.restoreEqual(e.store, "acme", "ck2", src2)
			} else {
				if !errdefs.IsNotFound(statErr) {
					t.Fatalf("interrupted checkpoint is visible: %v", statErr)
				}
				infos, _ := e.store.List(ctx(t), "acme")
				if len(infos) != 1 {
					t.Fatalf("list after interrupted put: %+v", infos)
				}
				if _, err := e.store.Restore(ctx(t), "acme", "ck2", filepath.Join(t.TempDir(), "x"), chunkstore.RestoreOptions{}); !errdefs.IsNotFound(err) {
					t.Fatalf("restore of an interrupted checkpoint: %v", err)
				}
			}
			// The earlier checkpoint is untouched: same objects, restorable.
			for _, k := range ck1Objects {
				if _, err := e.blobs.Stat(context.Background(), k); err != nil {
					t.Fatalf("object %s of ck1 is gone: %v", k, err)
				}
			}
			e.restoreEqual(e.store, "acme", "ck1", src1)

			// A crashed writer's marker blocks collection until it expires.
			gc, err := e.store.GC(ctx(t), "acme")
			if err != nil {
				t.Fatal(err)
			}
			crashed := tc.fault != nil // a crashed client could not clean up
			if gc.Deferred != crashed {
				t.Fatalf("gc right after the interruption: deferred=%v, want %v", gc.Deferred, crashed)
			}
			e.clock.Advance(2 * time.Hour)

			// A retry (a new process) succeeds.
			if !tc.visible {
				e.put("acme", "ck2", src2, chunkstore.PutOptions{})
			}
			e.restoreEqual(e.store, "acme", "ck2", src2)
			gc, err = e.store.GC(ctx(t), "acme")
			if err != nil || gc.Deferred {
				t.Fatalf("gc: %+v, %v", gc, err)
			}
			// Only what ck1 and ck2 reference is left.
			assertOnlyReferenced(t, e, "acme")
		})
	}
}

// assertOnlyReferenced checks that the tenant's objects are exactly the
// pointers, manifests and chunks of its committed checkpoints.
func assertOnlyReferenced(t *testing.T, e *env, tenant string) {
	t.Helper()
	infos, err := e.store.List(ctx(t), tenant)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, info := range infos {
		want += 2 // pointer, manifest
		if _, err := e.store.Verify(ctx(t), tenant, info.ID, chunkstore.RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Count distinct chunks referenced: a Put of every checkpoint again
	// would write none; instead compare against GC's own count.
	gc, err := e.store.GC(ctx(t), tenant)
	if err != nil {
		t.Fatal(err)
	}
	if gc.DeletedChunks != 0 || gc.DeletedPacks != 0 || gc.DeletedManifests != 0 {
		t.Fatalf("a second gc still deleted %+v", gc)
	}
	want += gc.Referenced + gc.Packs
	all := e.keys("tenants/" + tenant + "/")
	if len(all) != want {
		t.Fatalf("tenant %s holds %d objects, want %d (%d checkpoints, %d chunks, %d packs): %q",
			tenant, len(all), want, len(infos), gc.Referenced, gc.Packs, all)
	}
}

func testCommitHook(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 20)
	// A fenced writer: the hook refuses, nothing becomes visible.
	_, err := e.store.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{
		Commit: func(ctx context.Context, digest string, publish func(context.Context) error) error {
			return errdefs.Fencedf("lease epoch 3 is stale (current 4)")
		},
	})
	if !errdefs.IsFenced(err) {
		t.Fatalf("fenced put: got %v", err)
	}
	if _, err := e.store.Stat(ctx(t), "acme", "ck1"); !errdefs.IsNotFound(err) {
		t.Fatalf("fenced checkpoint is visible: %v", err)
	}
	// A hook that forgets to publish.
	_, err = e.store.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{
		Commit: func(context.Context, string, func(context.Context) error) error { return nil },
	})
	if err == nil {
		t.Fatal("put whose hook did not publish succeeded")
	}
	// The normal shape: check, publish, record.
	var seen string
	res, err := e.store.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{
		Commit: func(ctx context.Context, digest string, publish func(context.Context) error) error {
			if _, err := e.store.Stat(ctx, "acme", "ck1"); !errdefs.IsNotFound(err) {
				return fmt.Errorf("visible before publish: %v", err)
			}
			seen = digest
			if err := publish(ctx); err != nil {
				return err
			}
			if err := publish(ctx); err == nil {
				return errors.New("second publish accepted")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	info, _ := e.store.Stat(ctx(t), "acme", "ck1")
	if seen == "" || seen != res.ManifestDigest || info.ManifestDigest != seen {
		t.Fatalf("hook saw %q, result %q, pointer %q", seen, res.ManifestDigest, info.ManifestDigest)
	}
	// Publish then fail (the log append was refused): stays committed,
	// reported as such.
	res, err = e.store.Put(ctx(t), "acme", "ck2", src, chunkstore.PutOptions{
		Commit: func(ctx context.Context, digest string, publish func(context.Context) error) error {
			if err := publish(ctx); err != nil {
				return err
			}
			return errdefs.Fencedf("append refused")
		},
	})
	if !errdefs.IsFenced(err) || !res.Published {
		t.Fatalf("publish-then-fail: %v, published=%v", err, res.Published)
	}
	if _, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck2"); err != nil {
		t.Fatal(err)
	}
	// Committing an id twice is refused.
	if _, err := e.store.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second put of ck1: %v", err)
	}
	assertOnlyReferenced(t, e, "acme")
}

// A checkpoint in progress while GC runs never loses a chunk: here ck2
// reuses every chunk of ck1, and ck1 is deleted (and collected) while ck2 is
// between writing its manifest and its pointer.
func testGCConcurrentCheckpoint(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 30)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	inHook, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	var res chunkstore.PutResult
	go func() {
		var err error
		res, err = e.store.Put(context.Background(), "acme", "ck2", src, chunkstore.PutOptions{
			Parent: "ck1",
			Commit: func(ctx context.Context, _ string, publish func(context.Context) error) error {
				close(inHook)
				<-release
				return publish(ctx)
			},
		})
		done <- err
	}()
	<-inHook
	gc, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck1")
	if err != nil {
		t.Fatal(err)
	}
	if !gc.Deferred || gc.DeletedChunks+gc.DeletedPacks != 0 {
		t.Fatalf("gc during a checkpoint: %+v, want deferred", gc)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res.NewChunks != 0 {
		t.Fatalf("ck2 wrote %d chunks; the scenario needs it to reuse ck1's", res.NewChunks)
	}
	if gc, err = e.store.GC(ctx(t), "acme"); err != nil || gc.DeletedChunks+gc.DeletedPacks != 0 {
		t.Fatalf("gc after ck2 committed: %+v, %v", gc, err)
	}
	e.restoreEqual(e.store, "acme", "ck2", src)
	assertOnlyReferenced(t, e, "acme")
}

// A writer that starts while a collector is deleting waits for it, then
// writes again the chunks that were collected.
func testWriterWaitsForGC(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 40)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	// Delete ck1's pointer by hand so its chunks are garbage.
	must(t, e.blobs.Delete(context.Background(), "tenants/acme/checkpoints/ck1/COMMITTED"))

	listed, resume := make(chan struct{}), make(chan struct{})
	collector := e.reopen(func(step string) error {
		if step == "listed" {
			close(listed)
			<-resume
		}
		return nil
	})
	gcDone := make(chan chunkstore.GCResult, 1)
	go func() {
		gc, err := collector.GC(context.Background(), "acme")
		if err != nil {
			t.Error(err)
		}
		gcDone <- gc
	}()
	<-listed
	putDone := make(chan error, 1)
	var res chunkstore.PutResult
	go func() {
		var err error
		res, err = e.store.Put(context.Background(), "acme", "ck2", src, chunkstore.PutOptions{})
		putDone <- err
	}()
	select {
	case err := <-putDone:
		t.Fatalf("put finished while a collector held the lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(resume)
	gc := <-gcDone
	if gc.Deferred || gc.DeletedChunks+gc.DeletedPacks == 0 {
		t.Fatalf("gc: %+v, want it to collect ck1's chunks", gc)
	}
	if err := <-putDone; err != nil {
		t.Fatal(err)
	}
	if res.NewChunks == 0 {
		t.Fatal("ck2 wrote no chunks although the collector removed them")
	}
	e.restoreEqual(e.store, "acme", "ck2", src)
	assertOnlyReferenced(t, e, "acme")
}

func testStaleMarkers(t *testing.T, b backend) {
	e := newEnv(t, b, smallPacks)
	src := sampleTree(t, 50)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	// A writer that died after writing chunks (its client crashed).
	e.faulty.SetFault(blobtest.CrashAfter(3, isDataPut))
	if _, err := e.store.Put(ctx(t), "acme", "ck2", sampleTree(t, 51), chunkstore.PutOptions{}); err == nil {
		t.Fatal("crashed put succeeded")
	}
	e.faulty.SetFault(nil)
	if len(e.keys("tenants/acme/pending/")) != 1 {
		t.Fatalf("pending markers: %q", e.keys("tenants/acme/pending/"))
	}
	gc, err := e.store.GC(ctx(t), "acme")
	if err != nil || !gc.Deferred {
		t.Fatalf("gc with a live marker: %+v, %v", gc, err)
	}
	e.clock.Advance(61 * time.Minute)
	gc, err = e.store.GC(ctx(t), "acme")
	// Chunks are written by parallel workers, so how many of the dead
	// writer's objects landed before the crash varies (at most 3, and none
	// when the crash cancelled the writes in flight): what matters is that
	// its orphans go and only referenced objects stay.
	if err != nil || gc.Deferred || gc.StaleMarkers != 1 || gc.DeletedChunks+gc.DeletedPacks > 3 {
		t.Fatalf("gc after the marker expired: %+v, %v", gc, err)
	}
	assertOnlyReferenced(t, e, "acme")
	// A dead collector's lock does not block writers for ever.
	must(t, e.faulty.PutIfAbsent(context.Background(), "tenants/acme/gc.lock",
		strings.NewReader(`{"kind":"gc","holder":"dead","expires":"2026-11-29T13:30:00Z"}`), 62))
	e.clock.Advance(time.Hour)
	e.put("acme", "ck3", src, chunkstore.PutOptions{})
	if _, err := e.store.GC(ctx(t), "acme"); err != nil {
		t.Fatal(err)
	}
	assertOnlyReferenced(t, e, "acme")
}

// A writer whose marker a collector removed (it stalled past its expiry)
// must not commit.
func testLostMarker(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 60)
	s := e.reopen(func(step string) error {
		if step == "manifest" {
			for _, k := range e.keys("tenants/acme/pending/") {
				must(t, e.blobs.Delete(context.Background(), k))
			}
		}
		return nil
	})
	_, err := s.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{})
	if !errdefs.IsConflict(err) {
		t.Fatalf("put whose marker vanished: got %v, want conflict", err)
	}
	if _, err := e.store.Stat(ctx(t), "acme", "ck1"); !errdefs.IsNotFound(err) {
		t.Fatalf("checkpoint visible: %v", err)
	}
	// And one that stalled past expiry by its own clock.
	s = e.reopen(func(step string) error {
		if step == "manifest" {
			e.clock.Advance(2 * time.Hour)
		}
		return nil
	})
	if _, err := s.Put(ctx(t), "acme", "ck1", src, chunkstore.PutOptions{}); !errdefs.IsConflict(err) {
		t.Fatalf("put that stalled past its marker's expiry: got %v, want conflict", err)
	}
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	e.restoreEqual(e.store, "acme", "ck1", src)
}

func testConcurrentGC(t *testing.T, b backend) {
	e := newEnv(t, b)
	e.put("acme", "ck1", sampleTree(t, 70), chunkstore.PutOptions{})
	listed, resume := make(chan struct{}), make(chan struct{})
	first := e.reopen(func(step string) error {
		if step == "listed" {
			close(listed)
			<-resume
		}
		return nil
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := first.GC(context.Background(), "acme"); err != nil {
			t.Error(err)
		}
	})
	<-listed
	if _, err := e.store.GC(ctx(t), "acme"); !errdefs.IsConflict(err) {
		t.Errorf("second concurrent gc: got %v, want conflict", err)
	}
	close(resume)
	wg.Wait()
	if _, err := e.store.GC(ctx(t), "acme"); err != nil {
		t.Fatalf("gc after the first finished: %v", err)
	}
}

func testDeleteCheckpointAndTenant(t *testing.T, b backend) {
	e := newEnv(t, b, smallPacks)
	root := filepath.Join(t.TempDir(), "image")
	data := writeRandom(t, filepath.Join(root, "mem.img"), 80, 4<<20)
	e.put("acme", "ck1", root, chunkstore.PutOptions{})
	chunks1 := e.dataKeys("acme")
	copy(data[1<<20:], randBytes(81, 1<<20))
	must(t, os.WriteFile(filepath.Join(root, "mem.img"), data, 0o644))
	e.put("acme", "ck2", root, chunkstore.PutOptions{Parent: "ck1"})
	e.put("other", "ck1", root, chunkstore.PutOptions{})
	otherObjects := e.keys("tenants/other/")

	gc, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck1")
	if err != nil || gc.Deferred || gc.DeletedChunks+gc.DeletedPacks == 0 {
		t.Fatalf("delete ck1: %+v, %v", gc, err)
	}
	if _, err := e.store.Stat(ctx(t), "acme", "ck1"); !errdefs.IsNotFound(err) {
		t.Fatalf("ck1 still visible: %v", err)
	}
	left := e.dataKeys("acme")
	gone := 0
	for _, k := range chunks1 {
		if !slices.Contains(left, k) {
			gone++
		}
	}
	if gone != gc.DeletedChunks+gc.DeletedPacks {
		t.Fatalf("gc says %d chunks and %d packs deleted, listing shows %d of ck1's gone", gc.DeletedChunks, gc.DeletedPacks, gone)
	}
	if gone == len(chunks1) {
		t.Fatalf("all %d of ck1's objects went, though ck2 uses most of its chunks", gone)
	}
	if len(e.keys("tenants/acme/checkpoints/ck1/")) != 0 {
		t.Fatalf("ck1's objects remain: %q", e.keys("tenants/acme/checkpoints/ck1/"))
	}
	e.restoreEqual(e.store, "acme", "ck2", root)
	assertOnlyReferenced(t, e, "acme")

	if _, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck1"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := e.store.DeleteCheckpoint(ctx(t), "acme", "ck2"); err != nil {
		t.Fatal(err)
	}
	if k := e.keys("tenants/acme/"); len(k) != 0 {
		t.Fatalf("deleting every checkpoint left %q", k)
	}

	e.put("acme", "ck3", root, chunkstore.PutOptions{})
	n, bytes, err := e.store.DeleteTenant(ctx(t), "acme")
	if err != nil || n == 0 || bytes == 0 {
		t.Fatalf("delete tenant: %d objects, %d bytes, %v", n, bytes, err)
	}
	if k := e.keys("tenants/acme/"); len(k) != 0 {
		t.Fatalf("tenant deleted, objects left: %q", k)
	}
	if !slices.Equal(e.keys("tenants/other/"), otherObjects) {
		t.Fatal("deleting a tenant touched another tenant's objects")
	}
	e.restoreEqual(e.store, "other", "ck1", root)
}

func testProgress(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 90)
	var mu sync.Mutex
	var seen []chunkstore.Progress
	record := func(p chunkstore.Progress) {
		mu.Lock()
		seen = append(seen, p)
		mu.Unlock()
	}
	check := func(what string) {
		t.Helper()
		if len(seen) < 3 {
			t.Fatalf("%s: %d progress reports", what, len(seen))
		}
		for i := 1; i < len(seen); i++ {
			if seen[i].Done < seen[i-1].Done || seen[i].Total != seen[0].Total {
				t.Fatalf("%s: progress went %+v → %+v", what, seen[i-1], seen[i])
			}
		}
		if last := seen[len(seen)-1]; last.Done != last.Total || last.Total == 0 {
			t.Fatalf("%s: last progress %+v", what, last)
		}
		seen = nil
	}
	e.put("acme", "ck1", src, chunkstore.PutOptions{Progress: record})
	check("put")
	if _, err := e.store.Restore(ctx(t), "acme", "ck1", filepath.Join(t.TempDir(), "r"), chunkstore.RestoreOptions{Progress: record}); err != nil {
		t.Fatal(err)
	}
	check("restore")
}

func testValidation(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 100)
	for _, bad := range [][2]string{{"", "ck"}, {"a/b", "ck"}, {"..", "ck"}, {"acme", ""}, {"acme", "../x"}, {"acme", "-x"}, {"acme", strings.Repeat("x", 129)}} {
		if _, err := e.store.Put(ctx(t), bad[0], bad[1], src, chunkstore.PutOptions{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("put %q/%q: got %v, want invalid argument", bad[0], bad[1], err)
		}
	}
	if _, err := chunkstore.New(chunkstore.Config{Blobs: e.blobs, MasterKey: []byte("short")}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("short master key: %v", err)
	}
	fifoDir := t.TempDir()
	must(t, syscall.Mkfifo(filepath.Join(fifoDir, "fifo"), 0o600))
	if _, err := e.store.Put(ctx(t), "acme", "ck", fifoDir, chunkstore.PutOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("put of a fifo: %v", err)
	}
	if _, err := e.store.Put(ctx(t), "acme", "ck", filepath.Join(fifoDir, "missing"), chunkstore.PutOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("put of a missing dir: %v", err)
	}
	e.put("acme", "ck", src, chunkstore.PutOptions{})
	if _, err := e.store.Restore(ctx(t), "acme", "ck", t.TempDir(), chunkstore.RestoreOptions{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("restore onto an existing dir: %v", err)
	}
	// Nothing of the refused puts is left but the committed checkpoint.
	assertOnlyReferenced(t, e, "acme")
}

// A collector that stalled past its lock's expiry (writers may have started
// since) deletes nothing.
func testStalledCollector(t *testing.T, b backend) {
	e := newEnv(t, b)
	e.put("acme", "ck1", sampleTree(t, 110), chunkstore.PutOptions{})
	must(t, e.blobs.Delete(context.Background(), "tenants/acme/checkpoints/ck1/COMMITTED"))
	before := e.dataKeys("acme")
	stalled := e.reopen(func(step string) error {
		if step == "listed" {
			e.clock.Advance(2 * time.Hour)
		}
		return nil
	})
	gc, err := stalled.GC(ctx(t), "acme")
	if !errdefs.IsConflict(err) || gc.DeletedChunks+gc.DeletedPacks != 0 {
		t.Fatalf("stalled collector: %+v, %v; want conflict and nothing deleted", gc, err)
	}
	if !slices.Equal(e.dataKeys("acme"), before) {
		t.Fatal("stalled collector deleted chunks")
	}
	if gc, err := e.store.GC(ctx(t), "acme"); err != nil || gc.DeletedChunks+gc.DeletedPacks != len(before) {
		t.Fatalf("next gc: %+v, %v", gc, err)
	}
}

// A collector that dies holding gc.lock blocks the tenant's writers only
// until its lock expires, GCLockTTL (30 s) after it last renewed it — with
// the writers' hour (the old shared TTL), a daemon killed during GC stopped
// the tenant's checkpoints for an hour (chaos seed 4033).
func testDeadCollector(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 7)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	// The collector dies right after taking its lock (nothing released).
	var lock []byte
	dying := e.reopen(func(step string) error {
		if step == "marked" {
			b, err := blob.ReadAll(context.Background(), e.blobs, "tenants/acme/gc.lock", 1<<10)
			if err != nil {
				t.Fatal(err)
			}
			lock = b
			return errors.New("simulated death")
		}
		return nil
	})
	if _, err := dying.GC(ctx(t), "acme"); err == nil {
		t.Fatal("gc went on past its death")
	}
	var m struct{ Expires time.Time }
	if err := json.Unmarshal(lock, &m); err != nil {
		t.Fatal(err)
	}
	if ttl := m.Expires.Sub(e.clock.Now()); ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("gc.lock lives %s without renewal, want at most 30 s (writers wait for it)", ttl)
	}
	// Its lock is back, as a dead process leaves it.
	must(t, e.faulty.Put(context.Background(), "tenants/acme/gc.lock", bytes.NewReader(lock), int64(len(lock))))
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := e.store.Put(short, "acme", "ck2", src, chunkstore.PutOptions{}); err == nil {
		t.Fatal("a writer did not wait for a live gc.lock")
	}
	e.clock.Advance(31 * time.Second)
	e.put("acme", "ck2", src, chunkstore.PutOptions{})
	e.restoreEqual(e.store, "acme", "ck2", src)
}

// A gc.lock whose holder is a process of this host that is gone (a daemon
// killed while it collected) blocks no writer and no collector, however
// far its expiry: the writer goes on at once, the next collector replaces
// the lock. On main writers waited for its expiry (GCLockTTL).
func testDeadHolder(t *testing.T, b backend) {
	e := newEnv(t, b)
	src := sampleTree(t, 8)
	e.put("acme", "ck1", src, chunkstore.PutOptions{})
	cmd := exec.Command("true")
	must(t, cmd.Run())
	host, _ := os.Hostname()
	lock := fmt.Sprintf(`{"kind":"gc","holder":"%s/%d","expires":%q}`, host, cmd.Process.Pid, e.clock.Now().Add(time.Hour).Format(time.RFC3339Nano))
	must(t, e.faulty.Put(context.Background(), "tenants/acme/gc.lock", strings.NewReader(lock), int64(len(lock))))
	short, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.store.Put(short, "acme", "ck2", src, chunkstore.PutOptions{}); err != nil {
		t.Fatalf("a writer waited for the gc.lock of a dead process (pid %d): %v", cmd.Process.Pid, err)
	}
	e.restoreEqual(e.store, "acme", "ck2", src)
	if gc, err := e.store.GC(short, "acme"); err != nil || gc.Deferred {
		t.Fatalf("a collector after the dead one: %+v, %v", gc, err)
	}
	// A live holder's lock (this process) still holds writers.
	live := fmt.Sprintf(`{"kind":"gc","holder":"%s/%d","expires":%q}`, host, os.Getpid(), e.clock.Now().Add(time.Hour).Format(time.RFC3339Nano))
	must(t, e.faulty.Put(context.Background(), "tenants/acme/gc.lock", strings.NewReader(live), int64(len(live))))
	wait, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := e.store.Put(wait, "acme", "ck3", src, chunkstore.PutOptions{}); err == nil {
		t.Fatal("a writer did not wait for a live process's gc.lock")
	}
}
