// Package blobtest is the conformance suite of blob.Store: every backend runs
// Run against itself and must pass all of it. It also offers Faulty, a
// wrapping Store that injects failures, for tests of code built on blob.Store.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// Run runs the suite. newStore returns an empty store (a fresh directory, a
// fresh bucket or key prefix) for each subtest; the backend cleans it up
// through t.Cleanup. A backend that pages its listings should be configured
// with a small page size here, so that paging is exercised.
func Run(t *testing.T, newStore func(t *testing.T) blob.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s blob.Store)
	}{
		{"PutGetStat", testPutGetStat},
		{"Empty", testEmpty},
		{"NotFound", testNotFound},
		{"DeleteIdempotent", testDelete},
		{"Overwrite", testOverwrite},
		{"PutIfAbsent", testPutIfAbsent},
		{"PutIfAbsentRace", testPutIfAbsentRace},
		{"SizeMismatch", testSizeMismatch},
		{"TornPutNeverVisible", testTornPut},
		{"CancelledPut", testCancelledPut},
		{"Large", testLarge},
		{"UnknownSize", testUnknownSize},
		{"BadKeys", testBadKeys},
		{"List", testList},
		{"ListPaging", testListPaging},
		{"ListStopEarly", testListStopEarly},
		{"ConcurrentPuts", testConcurrentPuts},
		{"PathPrefixConflict", testPathPrefixConflict},
		{"ReadRange", testReadRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newStore(t))
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func put(t *testing.T, s blob.Store, key string, b []byte) {
	t.Helper()
	if err := blob.PutBytes(ctxT(t), s, key, b); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	b, err := blob.ReadAll(ctxT(t), s, key, 1<<30)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return b
}

func mustNotExist(t *testing.T, s blob.Store, key string) {
	t.Helper()
	if _, err := s.Stat(ctxT(t), key); !errdefs.IsNotFound(err) {
		t.Fatalf("stat %s: got %v, want not found", key, err)
	}
	if rc, err := s.Get(ctxT(t), key); !errdefs.IsNotFound(err) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("get %s: got %v, want not found", key, err)
	}
}

func listKeys(t *testing.T, s blob.Store, prefix string) []string {
	t.Helper()
	var keys []string
	for info, err := range s.List(ctxT(t), prefix) {
		if err != nil {
			t.Fatalf("list %q: %v", prefix, err)
		}
		keys = append(keys, info.Key)
	}
	return keys
}

func testPutGetStat(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	before := time.Now().Add(-time.Minute)
	data := []byte("hello, amber")
	put(t, s, "a/b/c.txt", data)
	if got := get(t, s, "a/b/c.txt"); !bytes.Equal(got, data) {
		t.Fatalf("get = %q, want %q", got, data)
	}
	info, err := s.Stat(ctx, "a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "a/b/c.txt" || info.Size != int64(len(data)) {
		t.Fatalf("stat = %+v", info)
	}
	if info.ModTime.Before(before) || info.ModTime.After(time.Now().Add(time.Minute)) {
		t.Fatalf("stat mod time %v is not about now", info.ModTime)
	}
}

func testEmpty(t *testing.T, s blob.Store) {
	put(t, s, "empty", nil)
	if got := get(t, s, "empty"); len(got) != 0 {
		t.Fatalf("get = %q, want empty", got)
	}
	info, err := s.Stat(ctxT(t), "empty")
	if err != nil || info.Size != 0 {
		t.Fatalf("stat = %+v, %v", info, err)
	}
}

func testNotFound(t *testing.T, s blob.Store) {
	mustNotExist(t, s, "missing")
	put(t, s, "dir/x", []byte("x"))
	mustNotExist(t, s, "dir")         // a "directory" is not an object
	mustNotExist(t, s, "dir/x/y")     // below an object
	mustNotExist(t, s, "dir/xx")      // a longer sibling
	mustNotExist(t, s, "other/dir/x") // elsewhere
}

func testDelete(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, s, "d/k", []byte("v"))
	put(t, s, "d/k2", []byte("v2"))
	for i := 0; i < 2; i++ {
		if err := s.Delete(ctx, "d/k"); err != nil {
			t.Fatalf("delete #%d: %v", i, err)
		}
	}
	mustNotExist(t, s, "d/k")
	if err := s.Delete(ctx, "never/was"); err != nil {
		t.Fatalf("delete missing: %v", err)
	}
	if got := listKeys(t, s, ""); !slices.Equal(got, []string{"d/k2"}) {
		t.Fatalf("list after delete = %q", got)
	}
	if err := s.Delete(ctx, "d/k2"); err != nil {
		t.Fatal(err)
	}
	if got := listKeys(t, s, ""); len(got) != 0 {
		t.Fatalf("list after deleting all = %q", got)
	}
	// The key can be written again after a delete.
	put(t, s, "d/k", []byte("again"))
	if got := get(t, s, "d/k"); string(got) != "again" {
		t.Fatalf("get = %q", got)
	}
}

func testOverwrite(t *testing.T, s blob.Store) {
	put(t, s, "o", []byte("first version, longer"))
	put(t, s, "o", []byte("second"))
	if got := get(t, s, "o"); string(got) != "second" {
		t.Fatalf("get = %q", got)
	}
	info, err := s.Stat(ctxT(t), "o")
	if err != nil || info.Size != 6 {
		t.Fatalf("stat = %+v, %v", info, err)
	}
}

func testPutIfAbsent(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	if err := s.PutIfAbsent(ctx, "p/ptr", strings.NewReader("one"), 3); err != nil {
		t.Fatal(err)
	}
	err := s.PutIfAbsent(ctx, "p/ptr", strings.NewReader("two"), 3)
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second PutIfAbsent: got %v, want already exists", err)
	}
	if got := get(t, s, "p/ptr"); string(got) != "one" {
		t.Fatalf("get = %q, want the first value", got)
	}
	// After a delete the key is absent again.
	if err := s.Delete(ctx, "p/ptr"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutIfAbsent(ctx, "p/ptr", strings.NewReader("three"), 5); err != nil {
		t.Fatal(err)
	}
	// A failed PutIfAbsent (torn reader) stores nothing.
	err = s.PutIfAbsent(ctx, "p/torn", &failingReader{n: 1000}, 5000)
	if err == nil {
		t.Fatal("PutIfAbsent with a failing reader succeeded")
	}
	mustNotExist(t, s, "p/torn")
}

func testPutIfAbsentRace(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const n = 8
	var wins, exists atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v := fmt.Sprintf("writer-%d", i)
			err := s.PutIfAbsent(ctx, "race/ptr", strings.NewReader(v), int64(len(v)))
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, errdefs.ErrAlreadyExists):
				exists.Add(1)
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || exists.Load() != n-1 {
		t.Fatalf("%d winners, %d already-exists; want 1 and %d", wins.Load(), exists.Load(), n-1)
	}
	if got := get(t, s, "race/ptr"); !strings.HasPrefix(string(got), "writer-") {
		t.Fatalf("get = %q", got)
	}
}

func testSizeMismatch(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, s, "sz/old", []byte("old"))
	for _, tc := range []struct {
		name string
		data string
		size int64
	}{
		{"short", "abc", 10},
		{"long", "abcdefghij", 3},
	} {
		for _, key := range []string{"sz/new", "sz/old"} {
			err := s.Put(ctx, key, strings.NewReader(tc.data), tc.size)
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s put %s: got %v, want invalid argument", tc.name, key, err)
			}
		}
	}
	mustNotExist(t, s, "sz/new")
	if got := get(t, s, "sz/old"); string(got) != "old" {
		t.Fatalf("sz/old = %q after failed overwrites", got)
	}
}

// failingReader yields n pseudo-random bytes and then an error, like a
// writer whose source died mid-stream.
type failingReader struct {
	n    int
	done int
}

var errReaderDied = errors.New("blobtest: source died mid-write")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.done >= f.n {
		return 0, errReaderDied
	}
	m := min(len(p), f.n-f.done)
	for i := range m {
		p[i] = byte(f.done + i)
	}
	f.done += m
	return m, nil
}

func testTornPut(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const size = 6 << 20
	err := s.Put(ctx, "torn/new", &failingReader{n: 1 << 20}, size)
	if err == nil {
		t.Fatal("put with a failing reader succeeded")
	}
	mustNotExist(t, s, "torn/new")
	// A torn overwrite leaves the previous object whole.
	put(t, s, "torn/old", []byte("previous"))
	if err := s.Put(ctx, "torn/old", &failingReader{n: 1 << 20}, size); err == nil {
		t.Fatal("overwrite with a failing reader succeeded")
	}
	if got := get(t, s, "torn/old"); string(got) != "previous" {
		t.Fatalf("torn/old = %.20q…, want the previous object", got)
	}
	// Unknown size too.
	if err := s.Put(ctx, "torn/unknown", &failingReader{n: 1 << 20}, -1); err == nil {
		t.Fatal("put of unknown size with a failing reader succeeded")
	}
	mustNotExist(t, s, "torn/unknown")
	if got := listKeys(t, s, "torn/"); !slices.Equal(got, []string{"torn/old"}) {
		t.Fatalf("list torn/ = %q", got)
	}
}

func testCancelledPut(t *testing.T, s blob.Store) {
	ctx, cancel := context.WithCancel(ctxT(t))
	r := &cancellingReader{cancel: cancel, after: 256 << 10}
	if err := s.Put(ctx, "cancel/x", r, 4<<20); err == nil {
		t.Fatal("put whose context was cancelled mid-write succeeded")
	}
	mustNotExist(t, s, "cancel/x")
}

type cancellingReader struct {
	cancel func()
	after  int
	done   int
}

func (c *cancellingReader) Read(p []byte) (int, error) {
	if c.done >= c.after {
		c.cancel()
	}
	n := min(len(p), 32<<10)
	clear(p[:n])
	c.done += n
	return n, nil
}

// genReader streams n deterministic pseudo-random bytes without holding them.
type genReader struct {
	rng *rand.ChaCha8
	n   int64
}

func newGen(seed byte, n int64) *genReader {
	var s [32]byte
	s[0] = seed
	return &genReader{rng: rand.NewChaCha8(s), n: n}
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.n {
		p = p[:g.n]
	}
	_, _ = g.rng.Read(p)
	g.n -= int64(len(p))
	return len(p), nil
}

func digest(t *testing.T, r io.Reader) ([32]byte, int64) {
	t.Helper()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatal(err)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d, n
}

func testLarge(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const size = 20 << 20
	if err := s.Put(ctx, "large/obj", newGen(1, size), size); err != nil {
		t.Fatal(err)
	}
	want, _ := digest(t, newGen(1, size))
	rc, err := s.Get(ctx, "large/obj")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, n := digest(t, rc)
	if n != size || got != want {
		t.Fatalf("read back %d bytes, digest match %v; want %d bytes", n, got == want, size)
	}
	info, err := s.Stat(ctx, "large/obj")
	if err != nil || info.Size != size {
		t.Fatalf("stat = %+v, %v", info, err)
	}
}

func testUnknownSize(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const size = 5<<20 + 123
	if err := s.Put(ctx, "unknown/obj", newGen(2, size), -1); err != nil {
		t.Fatal(err)
	}
	want, _ := digest(t, newGen(2, size))
	rc, err := s.Get(ctx, "unknown/obj")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if got, n := digest(t, rc); n != size || got != want {
		t.Fatalf("read back %d bytes (want %d), digest match %v", n, size, got == want)
	}
}

// BadKeys are keys every Store refuses with errdefs.ErrInvalidArgument.
var BadKeys = []string{
	"", "/", "/abs", "trailing/", "a//b", "..", "../up", "a/../b", "a/./b", ".", "./a",
	".hidden", "a/.hidden", "-dash", "sp ace", "tab\tkey", "nul\x00key", "back\\slash",
	"ünïcode", "q?uery", "star*", "a/b/" + strings.Repeat("s", 256),
	strings.Repeat("k/", 512) + "k",
}

func testBadKeys(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	for _, key := range BadKeys {
		checks := map[string]error{
			"Put":         s.Put(ctx, key, strings.NewReader("x"), 1),
			"PutIfAbsent": s.PutIfAbsent(ctx, key, strings.NewReader("x"), 1),
			"Delete":      s.Delete(ctx, key),
		}
		_, checks["Stat"] = s.Stat(ctx, key)
		rc, err := s.Get(ctx, key)
		if rc != nil {
			rc.Close()
		}
		checks["Get"] = err
		for op, err := range checks {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s(%q): got %v, want invalid argument", op, key, err)
			}
		}
	}
	for _, prefix := range []string{"/", "/a", "a//", "../", "a/../", "sp ace"} {
		var err error
		for _, e := range s.List(ctx, prefix) {
			err = e
		}
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("List(%q): got %v, want invalid argument", prefix, err)
		}
	}
	if got := listKeys(t, s, ""); len(got) != 0 {
		t.Fatalf("bad keys left objects: %q", got)
	}
	// Good keys at the edges of the grammar.
	for _, key := range []string{"a", "A-b_c.d=e", "0/1/2", strings.Repeat("x", 255), "z/b..c"} {
		put(t, s, key, []byte(key))
	}
}

func testList(t *testing.T, s blob.Store) {
	keys := []string{
		"t/a/1", "t/a/2", "t/a/sub/3", "t/a-b/4", "t/ab/5", "t/b", "u/x", "t/a.z",
	}
	for _, k := range keys {
		put(t, s, k, []byte(k))
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", sorted},
		{"t/", sorted[:len(sorted)-1]},
		{"t/a/", []string{"t/a/1", "t/a/2", "t/a/sub/3"}},
		{"t/a", []string{"t/a-b/4", "t/a.z", "t/a/1", "t/a/2", "t/a/sub/3", "t/ab/5"}},
		{"t/a/s", []string{"t/a/sub/3"}},
		{"t/b", []string{"t/b"}},
		{"t/c", nil},
		{"nothing/", nil},
		{"u", []string{"u/x"}},
	} {
		got := listKeys(t, s, tc.prefix)
		if !slices.Equal(got, tc.want) {
			t.Errorf("list %q = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	for info, err := range s.List(ctxT(t), "t/a/sub/") {
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != int64(len(info.Key)) || info.ModTime.IsZero() {
			t.Errorf("list info %+v", info)
		}
	}
}

func testListPaging(t *testing.T, s blob.Store) {
	const n = 57
	var want []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		k := fmt.Sprintf("page/%03d/obj", (i*37)%n)
		want = append(want, k)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			put(t, s, k, []byte{byte(i)})
		})
	}
	wg.Wait()
	put(t, s, "pagf", nil)
	slices.Sort(want)
	if got := listKeys(t, s, "page/"); !slices.Equal(got, want) {
		t.Fatalf("list page/ returned %d keys, want %d in order: %q", len(got), len(want), got)
	}
	if got := listKeys(t, s, "pag"); len(got) != n+1 || got[n] != "pagf" {
		t.Fatalf("list pag returned %d keys, want %d ending in pagf", len(got), n+1)
	}
}

func testListStopEarly(t *testing.T, s blob.Store) {
	for i := range 10 {
		put(t, s, fmt.Sprintf("stop/%d", i), nil)
	}
	var got []string
	for info, err := range s.List(ctxT(t), "stop/") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, info.Key)
		if len(got) == 3 {
			break
		}
	}
	if !slices.Equal(got, []string{"stop/0", "stop/1", "stop/2"}) {
		t.Fatalf("got %q", got)
	}
}

func testConcurrentPuts(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	const writers, each = 8, 6
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("conc/w%d/k%d", w, i)
				size := int64(1000 + 7919*(w*each+i))
				if err := s.Put(ctx, key, newGen(byte(w*each+i), size), size); err != nil {
					t.Errorf("put %s: %v", key, err)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	keys := listKeys(t, s, "conc/")
	if len(keys) != writers*each {
		t.Fatalf("listed %d keys, want %d", len(keys), writers*each)
	}
	for w := range writers {
		for i := range each {
			key := fmt.Sprintf("conc/w%d/k%d", w, i)
			size := int64(1000 + 7919*(w*each+i))
			want, _ := digest(t, newGen(byte(w*each+i), size))
			rc, err := s.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			got, n := digest(t, rc)
			rc.Close()
			if got != want || n != size {
				t.Fatalf("%s: content differs", key)
			}
		}
	}
}

func testPathPrefixConflict(t *testing.T, s blob.Store) {
	ctx := ctxT(t)
	put(t, s, "c/x", []byte("file"))
	err := blob.PutBytes(ctx, s, "c/x/y", []byte("below"))
	switch {
	case err == nil:
		if got := get(t, s, "c/x/y"); string(got) != "below" {
			t.Fatalf("c/x/y = %q", got)
		}
	case errdefs.IsConflict(err):
		mustNotExist(t, s, "c/x/y")
	default:
		t.Fatalf("put c/x/y: got %v, want success or conflict", err)
	}
	if got := get(t, s, "c/x"); string(got) != "file" {
		t.Fatalf("c/x = %q after put c/x/y", got)
	}
	put(t, s, "d/x/y", []byte("deep"))
	err = blob.PutBytes(ctx, s, "d/x", []byte("file"))
	if err != nil && !errdefs.IsConflict(err) {
		t.Fatalf("put d/x: got %v, want success or conflict", err)
	}
	if got := get(t, s, "d/x/y"); string(got) != "deep" {
		t.Fatalf("d/x/y = %q after put d/x", got)
	}
}

// testReadRange: blob.ReadRange returns exactly the bytes asked for, through
// the store's GetRange when it has one; a range past the end is data loss, a
// missing object not found. Every store of the daemon must implement
// GetRange (a chunk store's restore reads packs by ranges: without it each
// range reads the object from its start).
func testReadRange(t *testing.T, s blob.Store) {
	if _, ok := s.(blob.RangeGetter); !ok {
		t.Fatalf("%T does not implement blob.RangeGetter", s)
	}
	ctx := ctxT(t)
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	put(t, s, "packs/p1", data)
	for _, r := range [][2]int64{{0, 1}, {0, 3 << 20}, {1 << 20, 12345}, {3<<20 - 10, 10}, {5, 0}} {
		got, err := blob.ReadRange(ctx, s, "packs/p1", r[0], r[1])
		if err != nil {
			t.Fatalf("range %d+%d: %v", r[0], r[1], err)
		}
		if !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("range %d+%d: wrong bytes", r[0], r[1])
		}
	}
	if _, err := blob.ReadRange(ctx, s, "packs/p1", 3<<20-10, 11); !errdefs.IsDataLoss(err) {
		t.Fatalf("range past the end: %v, want data loss", err)
	}
	if _, err := blob.ReadRange(ctx, s, "packs/none", 0, 10); !errdefs.IsNotFound(err) {
		t.Fatalf("range of a missing object: %v, want not found", err)
	}
}
