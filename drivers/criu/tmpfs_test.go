package criu

import (
	"bytes"
	"compress/gzip"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// TestCheckpointTmpfsPlainTar: the content of a sandbox's tmpfs mounts
// (/dev/shm here, 8 MiB of random bytes) is dumped as a plain tar, not
// gzipped inside the frozen window (criu-4.1.1-tmpfs-plain-tar.patch),
// comes back byte for byte, and an image whose tmpfs archives are gzipped
// (as earlier builds wrote them) still restores.
//
//	go test -tags seccomp -count=1 -run TestCheckpointTmpfsPlainTar -v ./drivers/criu
func TestCheckpointTmpfsPlainTar(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	want := td.sh(id, "head -c 8388608 /dev/urandom > /dev/shm/blob && sha256sum /dev/shm/blob")

	images := t.TempDir()
	cs, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint with 8 MiB in /dev/shm: frozen %v, total %v", cs.Frozen, cs.Total)
	var archives []string
	_ = filepath.WalkDir(images, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.HasPrefix(e.Name(), "tmpfs-") {
			archives = append(archives, p)
		}
		return nil
	})
	if len(archives) == 0 {
		t.Fatalf("no tmpfs archive in the image %s", images)
	}
	biggest := int64(0)
	for _, a := range archives {
		b, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
			t.Errorf("%s is gzipped (the unpatched CRIU's dump)", filepath.Base(a))
		} else if len(b) < 263 || string(b[257:262]) != "ustar" {
			t.Errorf("%s is not a tar archive", filepath.Base(a))
		}
		biggest = max(biggest, int64(len(b)))
	}
	if biggest < 8<<20 {
		t.Errorf("the largest tmpfs archive holds %d bytes, less than /dev/shm's 8 MiB", biggest)
	}

	restore := func(what string) {
		t.Helper()
		if err := td.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
		if _, err := td.Restore(ctx, spec, images, sandbox.RestoreOptions{}); err != nil {
			t.Fatalf("restore %s: %v", what, err)
		}
		if got := td.sh(id, "sha256sum /dev/shm/blob"); got != want {
			t.Fatalf("restore %s: /dev/shm/blob is %q, was %q", what, got, want)
		}
	}
	restore("of the plain archives")

	// The image as an earlier build wrote it.
	for _, a := range archives {
		b, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		_, _ = w.Write(b)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(a, z.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	restore("of gzipped archives")
}
