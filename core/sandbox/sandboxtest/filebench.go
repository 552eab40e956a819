package sandboxtest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
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

// FilesBenchmark measures viaAgent against host, the same sandbox's files
// through its agent and through the host-side view, in one run: two rounds
// of 1 MiB (the second is the figure; the first warms both), then 4 KiB
// (the calls' fixed cost), 50 of each.
func FilesBenchmark(t *testing.T, viaAgent, host sandbox.FS) {
	t.Helper()
	for range 2 {
		FileBench(t, "agent", viaAgent, 1<<20, 50)
		FileBench(t, "confinedfs", host, 1<<20, 50)
	}
	FileBench(t, "agent", viaAgent, 4<<10, 50)
	FileBench(t, "confinedfs", host, 4<<10, 50)
}

// TokenUnreadable checks that fs, a sandbox's files served by its agent
// (the sandbox's root), reads nothing of the sandbox's /proc, where the
// agent's initial environment holds token: not /proc/1/environ, not
// /proc/self/environ, and not link, a symlink to /proc/1/environ the
// sandbox planted.
func TokenUnreadable(t *testing.T, fs sandbox.FS, token, link string) {
	t.Helper()
	ctx := ctxFor(t, callTimeout)
	for _, p := range []string{"/proc/1/environ", link, "/proc/self/environ"} {
		var b bytes.Buffer
		err := fs.ReadFile(ctx, p, &b)
		if strings.Contains(b.String(), token) {
			t.Fatalf("ReadFile(%s) gave the agent's token", p)
		}
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("ReadFile(%s) = %v, want permission denied", p, err)
		}
	}
}
