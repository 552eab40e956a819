package sandboxtest

import (
	"bytes"
	"crypto/rand"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// FileBench measures n WriteFile and n ReadFile calls of size bytes
// through fs (to /root/filebench) and logs their p50 and p90 under label.
// Drivers' benchmark tests call it for each FS they compare, on the same
// sandbox in the same run.
func FileBench(t *testing.T, label string, fs sandbox.FS, size, n int) {
	t.Helper()
	ctx := ctxFor(t, time.Duration(n)*callTimeout)
	data := make([]byte, size)
	_, _ = rand.Read(data)
	var writes, reads []time.Duration
	for range n {
		begin := time.Now()
		if err := fs.WriteFile(ctx, "/root/filebench", bytes.NewReader(data), 0o644); err != nil {
			t.Fatalf("%s: write: %v", label, err)
		}
		writes = append(writes, time.Since(begin))
		begin = time.Now()
		var got countWriter
		if err := fs.ReadFile(ctx, "/root/filebench", &got); err != nil || int(got) != size {
			t.Fatalf("%s: read %d bytes, %v", label, got, err)
		}
		reads = append(reads, time.Since(begin))
	}
	p := func(ds []time.Duration, q int) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[(len(s)-1)*q/100].Round(10 * time.Microsecond)
	}
	t.Logf("%s, %d KiB, n=%d: write p50 %v p90 %v; read p50 %v p90 %v", label, size>>10, n, p(writes, 50), p(writes, 90), p(reads, 50), p(reads, 90))
}

type countWriter int

func (c *countWriter) Write(b []byte) (int, error) { *c += countWriter(len(b)); return len(b), nil }

var _ io.Writer = (*countWriter)(nil)
