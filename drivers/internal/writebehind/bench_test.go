package writebehind

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkFsyncAfterSave: the fsync after 64 MiB written at the pace of a
// driver's save (1 MiB every 1.5 ms), with a bare fsync ("bare") and with
// write-behind during the writes ("writebehind"). fsync-ms is what a strict
// acknowledgement waits for after the resume; write-ms the writes
// themselves. Run it where the daemon keeps its images (the test's temp
// directory is used; set TMPDIR to that disk):
//
//	TMPDIR=/var/lib go test -run '^$' -bench BenchmarkFsyncAfterSave -benchtime 5x ./drivers/internal/writebehind
func BenchmarkFsyncAfterSave(b *testing.B) {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*31 + i>>9)
	}
	for _, wb := range []bool{false, true} {
		name := "bare"
		if wb {
			name = "writebehind"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			var writes, syncs time.Duration
			n := 0
			for b.Loop() {
				f, err := os.Create(filepath.Join(dir, "pages.img"))
				if err != nil {
					b.Fatal(err)
				}
				var w *W
				if wb {
					w = Files([]*os.File{f}, Interval)
				}
				t0 := time.Now()
				for range 64 {
					if _, err := f.Write(chunk); err != nil {
						b.Fatal(err)
					}
					time.Sleep(1500 * time.Microsecond)
				}
				if w != nil {
					w.Stop()
				}
				t1 := time.Now()
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				syncs += time.Since(t1)
				writes += t1.Sub(t0)
				n++
				f.Close()
				b.StopTimer()
				os.Remove(f.Name())
				b.StartTimer()
			}
			b.ReportMetric(float64(syncs.Milliseconds())/float64(n), "fsync-ms")
			b.ReportMetric(float64(writes.Milliseconds())/float64(n), "write-ms")
		})
	}
}
