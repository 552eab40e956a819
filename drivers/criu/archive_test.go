package criu

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
	"github.com/amber-run/amber/lib/failpoint"
)

// archiveHostDir makes a host directory outside the driver's state holding
// a marker file; check fails the test if the directory, its mode, owner
// or names, or the marker's content changed.
func archiveHostDir(t *testing.T) (dir string, check func(when string)) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "amber-archive-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte("HOST-SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Stat(dir, &before); err != nil {
		t.Fatal(err)
	}
	return dir, func(when string) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil || st.Mode != before.Mode || st.Uid != before.Uid || st.Gid != before.Gid || st.Mtim != before.Mtim {
			t.Errorf("%s: the host directory changed: mode %o owner %d:%d (was %o %d:%d) %v", when, st.Mode, st.Uid, st.Gid, before.Mode, before.Uid, before.Gid, err)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 || ents[0].Name() != "marker" {
			t.Errorf("%s: the host directory holds %v", when, ents)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "marker")); err != nil || string(b) != "HOST-SECRET" {
			t.Errorf("%s: the host marker is %q %v", when, b, err)
		}
	}
}

// TestCheckpointArchiveIgnoresSwappedSymlink: through the driver's
// Checkpoint and Restore, a directory of the layer swapped for a symlink to
// a host directory — on the host side of the layer, as the files API
// racing the cut would — while the archive is walked (after it listed the
// layer's root) or extracted (right after it made the directory) neither
// brings the host's files into the checkpoint nor chowns, chmods or writes
// the host directory: the cut archives the symlink as a symlink; the
// restore is refused (ErrDataLoss) and a restore without the race works.
func TestCheckpointArchiveIgnoresSwappedSymlink(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	fp := failpoint.New()
	td.opts.Failpoints = fp
	host, unchanged := archiveHostDir(t)
	id := td.create(sandbox.Limits{})
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	td.sh(id, `mkdir -p /work/sub && echo own > /work/sub/own && echo top > /work/top && chown -R 4321:4321 /work && chmod 700 /work`)
	upper := filepath.Join(td.layerDir(id), "fs", "upper") // drivers/internal/layer's layout
	swap := func() error {
		work := filepath.Join(upper, "work")
		if err := os.RemoveAll(work); err != nil {
			return err
		}
		return os.Symlink(host, work)
	}

	// A cut without the race: /work is a directory in its archive.
	image := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}

	// Its restore, racing: /work is swapped right after the extraction
	// made it.
	fp.ArmEach(layer.FPExtractMkdir, 1, func(subject string) error {
		if subject == "work" {
			return swap()
		}
		return nil
	})
	_, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{})
	fp.Disarm(layer.FPExtractMkdir)
	if fp.Hits(layer.FPExtractMkdir) == 0 {
		t.Fatal("the restore never extracted a directory")
	}
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "work is not a directory") {
		t.Errorf("restore through the swapped /work: %v, want it refused naming work", err)
	}
	unchanged("after the racing restore")
	if _, err := td.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore without the race: %v", err)
	}
	if out := td.sh(id, `cat /work/sub/own /work/top; stat -c '%u %a' /work`); out != "own\ntop\n4321 700\n" {
		t.Errorf("restored /work: %q", out)
	}

	// A cut, racing: /work is swapped after the walk listed the root.
	swapped := false
	fp.ArmFunc(layer.FPArchiveListed, fp.Hits(layer.FPArchiveListed)+1, func(subject string) error {
		if subject != "." {
			t.Errorf("first listed %q, want the root", subject)
		}
		swapped = true
		return swap()
	})
	image2 := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, image2, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if !swapped {
		t.Fatal("the cut never walked the layer")
	}
	checkArchive(t, filepath.Join(image2, imageLayerName), host)
	unchanged("after the racing cut")
}

// checkArchive fails the test if the layer archive holds the host
// directory's marker, or work as anything but a symlink to host.
func checkArchive(t *testing.T, archive, host string) {
	t.Helper()
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("HOST-SECRET")) {
		t.Error("the checkpoint's layer.tar holds the host directory's marker")
	}
	tr := tar.NewReader(bytes.NewReader(b))
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "work/") {
			t.Errorf("the archive has %q: the walk went through the swapped symlink", h.Name)
		}
		if h.Name == "work" || h.Name == "work/" {
			found = true
			if h.Typeflag != tar.TypeSymlink || h.Linkname != host {
				t.Errorf("work archived as type %q -> %q, want the symlink to %s it is", h.Typeflag, h.Linkname, host)
			}
		}
	}
	if !found {
		t.Error("work is not in the archive")
	}
}
