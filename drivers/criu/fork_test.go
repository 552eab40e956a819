package criu

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/userns"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// TestForkWhileOriginalRuns forks a running sandbox (a restore of its
// checkpoint into a new id) while the original keeps running: the fork
// gets its own uid range, the same memory state, the layer's files with
// their in-sandbox owners, and nothing written in one is seen in the
// other. The checkpoint's image is not changed by the fork.
func TestForkWhileOriginalRuns(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	counter, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	td.sh(id, "echo owned > /root/owned; chown 1000:1001 /root/owned; echo shm > /dev/shm/owned; chown 1002:1003 /dev/shm/owned")
	time.Sleep(300 * time.Millisecond)
	lines := counterLines(t, td, id, counter)
	if len(lines) == 0 {
		t.Fatal("counter logged nothing")
	}
	random := lines[0][1]

	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	before := treeDigest(t, images)

	fork := newID("fork")
	spec := sandbox.Spec{ID: fork, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	if _, err := td.Restore(ctx, spec, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("fork while the original runs: %v", err)
	}
	if after := treeDigest(t, images); after != before {
		t.Errorf("the fork changed the checkpoint's image:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat(td.forkImageDir(fork)); !os.IsNotExist(err) {
		t.Errorf("the fork's copy of the image is left after the restore: %v", err)
	}

	infos := map[string]sandbox.Info{}
	for _, s := range []string{id, fork} {
		info, err := td.Inspect(ctx, s)
		if err != nil || info.State != sandbox.StateRunning || info.InitPID <= 0 {
			t.Fatalf("%s after the fork: %+v %v", s, info, err)
		}
		infos[s] = info
	}
	time.Sleep(200 * time.Millisecond)
	fl := counterLines(t, td, fork, counter)
	if len(fl) == 0 || fl[0][1] != random || fl[len(fl)-1][1] != random {
		t.Errorf("fork's counter %v, want the original's random value %s", fl, random)
	}
	if ol := counterLines(t, td, id, counter); len(ol) == 0 || ol[len(ol)-1][1] != random {
		t.Errorf("original's counter after the fork: %v", ol)
	}

	// In-sandbox owners, in the layer and in a tmpfs.
	for _, s := range []string{id, fork} {
		if out := td.sh(s, "stat -c '%u:%g' /root/owned /dev/shm/owned"); out != "1000:1001\n1002:1003\n" {
			t.Errorf("%s: owners %q, want 1000:1001 and 1002:1003", s, out)
		}
	}

	// Two uid ranges: the inits' host uids, the maps, the layer's files
	// on the host.
	recs := map[string]*record{}
	for _, s := range []string{id, fork} {
		rec, err := td.loadRecord(s)
		if err != nil {
			t.Fatal(err)
		}
		recs[s] = rec
		if uid := hostUID(t, infos[s].InitPID); uid != rec.HostID {
			t.Errorf("%s: init's host uid %d, want its range's %d", s, uid, rec.HostID)
		}
		if m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", infos[s].InitPID)); !strings.Contains(strings.Join(strings.Fields(string(m)), " "), fmt.Sprintf("0 %d %d", rec.HostID, idsPerSandbox)) {
			t.Errorf("%s: uid_map %q, want 0 %d %d", s, m, rec.HostID, idsPerSandbox)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(td.layerDir(s), "fs", "upper", "root", "owned"), &st); err != nil {
			t.Error(err)
		} else if int(st.Uid) != rec.HostID+1000 || int(st.Gid) != rec.HostID+1001 {
			t.Errorf("%s: /root/owned is host %d:%d, want %d:%d", s, st.Uid, st.Gid, rec.HostID+1000, rec.HostID+1001)
		}
	}
	t.Logf("original: host uid %d (slot %d), fork: host uid %d (slot %d)", recs[id].HostID, recs[id].Slot, recs[fork].HostID, recs[fork].Slot)
	if recs[id].HostID == recs[fork].HostID || recs[id].Slot == recs[fork].Slot {
		t.Fatalf("the fork shares the original's uid range: %d (slot %d)", recs[fork].HostID, recs[fork].Slot)
	}

	// Independent: files, and each keeps running when the other dies.
	td.sh(fork, "echo fork > /root/from-fork; echo fork > /dev/shm/from-fork")
	td.sh(id, "echo orig > /root/from-orig")
	if out := td.sh(id, "ls /root /dev/shm"); strings.Contains(out, "from-fork") {
		t.Errorf("the original sees the fork's files: %q", out)
	}
	if out := td.sh(fork, "ls /root"); strings.Contains(out, "from-orig") {
		t.Errorf("the fork sees the original's files: %q", out)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out := td.sh(fork, "cat /root/from-fork"); out != "fork\n" {
		t.Errorf("fork after the original's destroy: %q", out)
	}
	if err := td.Destroy(ctx, fork); err != nil {
		t.Fatal(err)
	}
	// td's cleanup checks that no mount, cgroup, slot or state is left.
}

// hostUID is the real uid of host process pid.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			var u int
			fmt.Sscan(f[1], &u)
			return u
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return -1
}

// treeDigest digests the names, modes, owners and contents of the files
// under dir.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %o %d:%d\n", p, st.Mode, st.Uid, st.Gid)
		if de.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestForkLazy forks lazily while the original runs: the page server
// serves the fork's memory from the fork's private copy of the image,
// which lives until the load ends (RestoreStats.Loaded).
func TestForkLazy(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	if !td.Capabilities().LazyRestore {
		t.Skip("LazyRestore is off")
	}
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	lines := counterLines(t, td, id, pid)
	if len(lines) == 0 {
		t.Fatal("counter logged nothing")
	}
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	fork := newID("fork")
	rs, err := td.Restore(ctx, sandbox.Spec{ID: fork}, images, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatalf("lazy fork while the original runs: %v", err)
	}
	if !rs.Lazy {
		t.Error("RestoreStats.Lazy is false")
	}
	time.Sleep(400 * time.Millisecond)
	if fl := counterLines(t, td, fork, pid); len(fl) == 0 || fl[len(fl)-1][1] != lines[0][1] {
		t.Errorf("fork's counter %v, want the random value %s", fl, lines[0][1])
	}
	select {
	case err := <-rs.Loaded:
		if err != nil {
			t.Fatalf("the lazy fork's load: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the lazy fork's load did not end in a minute")
	}
	if _, err := os.Stat(td.forkImageDir(fork)); !os.IsNotExist(err) {
		t.Errorf("the lazy fork's copy of the image once its load ended: %v", err)
	}
	if out := td.sh(id, "echo ok"); out != "ok\n" {
		t.Errorf("original after the fork: %q", out)
	}
	if err := td.Destroy(ctx, fork); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(td.forkImageDir(fork)); !os.IsNotExist(err) {
		t.Errorf("the fork's copy of the image outlives the fork: %v", err)
	}
}

// TestRemapUserns moves a user namespace image's extents from one uid
// range to another and refuses an extent outside the image's range.
func TestRemapUserns(t *testing.T) {
	dir := t.TempDir()
	const oldHost, newHost = 5 * idsPerSandbox, 9 * idsPerSandbox
	write := func(name string, lower, count uint32) string {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ext := func() []*userns.UidGidExtent {
			first := uint32(0)
			return []*userns.UidGidExtent{{First: &first, LowerFirst: &lower, Count: &count}}
		}
		img := &crit.CriuImage{Magic: "USERNS", Entries: []*crit.CriuEntry{{Message: &userns.UsernsEntry{UidMap: ext(), GidMap: ext()}}}}
		if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
			t.Fatal(err)
		}
		return p
	}
	src := write("userns-1.img", oldHost, idsPerSandbox)
	dst := filepath.Join(dir, "out.img")
	if err := remapUserns(src, dst, oldHost, newHost); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(&userns.UsernsEntry{})
	if err != nil {
		t.Fatal(err)
	}
	ue := img.Entries[0].Message.(*userns.UsernsEntry)
	for _, x := range append(ue.UidMap, ue.GidMap...) {
		if x.GetFirst() != 0 || x.GetLowerFirst() != newHost || x.GetCount() != idsPerSandbox {
			t.Errorf("remapped extent %v, want 0 %d %d", x, newHost, idsPerSandbox)
		}
	}
	bad := write("userns-2.img", oldHost+1, idsPerSandbox)
	if err := remapUserns(bad, filepath.Join(dir, "bad.img"), oldHost, newHost); !errdefs.IsDataLoss(err) {
		t.Errorf("an extent reaching outside the image's range: %v, want DataLoss", err)
	}
}
