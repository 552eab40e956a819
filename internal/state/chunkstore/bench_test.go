package chunkstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/chunkstore"
)

// sinkStore keeps small objects (markers, manifests, pointers) and throws
// chunks away, so BenchmarkPut measures chunking, hashing, compression and
// encryption rather than storage.
type sinkStore struct{ *blobtest.Mem }

func (s sinkStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.Contains(key, "/chunks/") || strings.Contains(key, "/packs/") {
		_, err := io.Copy(io.Discard, r)
		return err
	}
	return s.Mem.Put(ctx, key, r, size)
}

// imageData returns size bytes shaped like a memory image: 1/2 random pages,
// 1/4 zero pages, 1/4 compressible (text-like) pages, in 4 KiB pages
// shuffled by seed.
func imageData(seed uint64, size int) []byte {
	b := randBytes(seed, size)
	rng := rand.New(rand.NewPCG(seed, 1))
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789 ", 80))
	for off := 0; off+4096 <= size; off += 4096 {
		switch rng.IntN(4) {
		case 0:
			clear(b[off : off+4096])
		case 1:
			copy(b[off:off+4096], text[rng.IntN(len(text)-4096):])
			b[off+rng.IntN(4096)] = byte(rng.Uint32())
		}
	}
	return b
}

func benchTree(b testing.TB, data []byte) string {
	root := filepath.Join(b.TempDir(), "image")
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "pages-1.img"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	return root
}

// BenchmarkPut: MB/s of Put's CPU pipeline (chunk, SHA-256, name, zstd,
// AES-GCM) with chunks discarded.
//
//	go test -run '^$' -bench BenchmarkPut -benchtime 5x ./internal/state/chunkstore
func BenchmarkPut(b *testing.B) {
	const size = 64 << 20
	for _, kind := range []struct {
		name string
		data []byte
	}{
		{"random", randBytes(1, size)},
		{"image", imageData(1, size)},
		{"zeros", make([]byte, size)},
	} {
		b.Run(kind.name, func(b *testing.B) {
			root := benchTree(b, kind.data)
			s, err := chunkstore.New(chunkstore.Config{Blobs: sinkStore{blobtest.NewMem()}, MasterKey: masterKey,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := s.Put(context.Background(), "bench", fmt.Sprintf("ck%d", i), root, chunkstore.PutOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRestore: MB/s of Verify (fetch, AES-GCM open, zstd, SHA-256)
// from memory.
//
//	go test -run '^$' -bench BenchmarkRestore -benchtime 5x ./internal/state/chunkstore
func BenchmarkRestore(b *testing.B) {
	const size = 64 << 20
	for _, kind := range []struct {
		name string
		data []byte
	}{
		{"random", randBytes(1, size)},
		{"image", imageData(1, size)},
	} {
		b.Run(kind.name, func(b *testing.B) {
			root := benchTree(b, kind.data)
			s, err := chunkstore.New(chunkstore.Config{Blobs: blobtest.NewMem(), MasterKey: masterKey,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Put(context.Background(), "bench", "ck", root, chunkstore.PutOptions{}); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Verify(context.Background(), "bench", "ck", chunkstore.RestoreOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestBenchReport measures, on localfs and on a real MinIO, the time and
// stored bytes of a first 256 MiB checkpoint, of a second one after a 1 MiB
// change (contiguous, and as 256 scattered 4 KiB pages), and restore
// throughput. It runs only with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 go test -run TestBenchReport -v -timeout 30m ./internal/state/chunkstore
func TestBenchReport(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to run the storage benchmark report")
	}
	size := 256 << 20
	if v := os.Getenv("AMBER_BENCH_MIB"); v != "" {
		fmt.Sscan(v, &size)
		size <<= 20
	}
	backends := []backend{localBackend(), minioBackend(t)}
	var report []string
	for _, b := range backends {
		for _, change := range []string{"contiguous", "scattered"} {
			report = append(report, benchOne(t, b, size, change)...)
		}
	}
	var load [3]float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscan(string(b), &load[0], &load[1], &load[2])
	}
	header := []string{
		fmt.Sprintf("%d MiB image-like data (1/2 random, 1/4 zero, 1/4 text pages); load average %.1f on %d CPUs", size>>20, load[0], runtime.NumCPU()),
		"| backend | change     | step                       |     wall    |  throughput   |  CPU (Amber) |   stored       | notes |",
		"|---------|------------|----------------------------|-------------|---------------|-------------|----------------|-------|",
	}
	report = append(header, report...)
	t.Log("\n" + strings.Join(report, "\n"))
	if out := os.Getenv("AMBER_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(strings.Join(report, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func benchOne(t *testing.T, b backend, size int, change string) []string {
	e := newEnv(t, b)
	e.cfg.Clock = nil // wall clock
	e.store = e.reopen(nil)
	data := imageData(42, size)
	root := benchTree(t, data)
	var lines []string
	cpu0 := cpuTime()
	row := func(what string, d time.Duration, bytes int64, extra string) {
		cpu := cpuTime() - cpu0
		lines = append(lines, fmt.Sprintf("| %-7s | %-10s | %-26s | %8.0f ms | %9.1f MB/s | %8.0f ms | %10.2f MiB | %s |",
			b.name, change, what, float64(d.Microseconds())/1000, float64(size)/1e6/d.Seconds(),
			float64(cpu.Microseconds())/1000, float64(bytes)/(1<<20), extra))
		cpu0 = cpuTime()
	}
	start := time.Now()
	r1 := e.put("bench", "ck1", root, chunkstore.PutOptions{})
	row("first put", time.Since(start), e.storedBytes(""), fmt.Sprintf("%d chunks, %d objects", r1.Chunks, r1.NewChunks))

	const changed = 1 << 20
	rng := rand.New(rand.NewPCG(7, 7))
	switch change {
	case "contiguous":
		off := size/2 + 12345
		copy(data[off:off+changed], randBytes(43, changed))
	case "scattered":
		for range changed / 4096 {
			off := rng.IntN(size/4096) * 4096
			copy(data[off:off+4096], randBytes(rng.Uint64(), 4096))
		}
	}
	must(t, os.WriteFile(filepath.Join(root, "pages-1.img"), data, 0o644))
	before := e.storedBytes("")
	cpu0 = cpuTime()
	start = time.Now()
	r2 := e.put("bench", "ck2", root, chunkstore.PutOptions{Parent: "ck1"})
	limit := int64(1.5*changed) + 1<<20
	delta := e.storedBytes("") - before
	verdict := "within"
	if delta > limit {
		verdict = "OVER"
	}
	row("second put, 1 MiB changed", time.Since(start), delta,
		fmt.Sprintf("%d new chunks; target ≤ %.2f MiB: %s", r2.NewChunks, float64(limit)/(1<<20), verdict))

	dst := filepath.Join(t.TempDir(), "restored")
	start = time.Now()
	cpu0 = cpuTime()
	rr, err := e.store.Restore(ctx(t), "bench", "ck2", dst, chunkstore.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	row("restore to disk", time.Since(start), 0, fmt.Sprintf("%d chunk refs, %d fetched", rr.Chunks, rr.Fetched))
	got, err := os.ReadFile(filepath.Join(dst, "pages-1.img"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("restored image differs (%v)", err)
	}
	if _, _, err := e.store.DeleteTenant(ctx(t), "bench"); err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return lines
}

// cpuTime is the CPU time (user + system) this process has used: the
// storage engine's cost, independent of what else loads the machine
// (MinIO runs in another process and is not counted).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
