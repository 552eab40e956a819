package sandboxtest

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

func (s *suite) testLifecycle(t *testing.T) {
	ctx := ctxFor(t, 5*time.Minute)
	before := time.Now().Add(-time.Second)
	id := s.create(t, "life", sandbox.Limits{})

	info, err := s.d.Inspect(ctx, id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.ID != id || info.State != sandbox.StateRunning || info.InitPID <= 0 {
		t.Errorf("Inspect = %+v, want running with an init pid", info)
	}
	if info.Created.Before(before) || info.Created.After(time.Now().Add(time.Second)) {
		t.Errorf("Created = %v, want about now", info.Created)
	}

	if _, err := s.d.Create(ctx, sandbox.Spec{ID: id, Template: s.opts.MinimalTemplate}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Create(%s) = %v, want already exists", id, err)
	}
	for _, bad := range []string{"", "Upper", "a/b", "../x", "x y", strings.Repeat("a", 49)} {
		if _, err := s.d.Create(ctx, sandbox.Spec{ID: bad, Template: s.opts.MinimalTemplate}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%q) = %v, want invalid argument", bad, err)
		}
	}

	list, err := s.d.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	i := slices.IndexFunc(list, func(in sandbox.Info) bool { return in.ID == id })
	if i < 0 || list[i].State != sandbox.StateRunning {
		t.Errorf("List = %+v, want %s running", list, id)
	}

	// A write lands in the sandbox's layer, never in the template.
	marker := randToken("life")
	s.sh(t, id, "echo "+marker+" > /"+marker)
	if _, err := os.Stat(filepath.Join(s.opts.MinimalTemplate.RootFS, marker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file written in the sandbox appeared in the template (stat: %v)", err)
	}

	// Unknown ids.
	ghost := s.newID("ghost")
	if _, err := s.d.Inspect(ctx, ghost); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Inspect(unknown) = %v, want not found", err)
	}
	if _, err := s.d.Exec(ctx, ghost, sandbox.ExecSpec{Args: []string{"true"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec(unknown) = %v, want not found", err)
	}
	if err := s.d.Destroy(ctx, ghost); err != nil {
		t.Errorf("Destroy(unknown) = %v, want nil", err)
	}

	// Destroy, twice.
	if err := s.d.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := s.d.Inspect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Inspect after Destroy = %v, want not found", err)
	}
	if _, err := s.d.Files(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Files after Destroy = %v, want not found", err)
	}
	if _, err := s.d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"true"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec after Destroy = %v, want not found", err)
	}
	list, err = s.d.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if slices.ContainsFunc(list, func(in sandbox.Info) bool { return in.ID == id }) {
		t.Errorf("List after Destroy still has %s", id)
	}
	if err := s.d.Destroy(ctx, id); err != nil {
		t.Errorf("second Destroy = %v, want nil", err)
	}
	for _, l := range hostLeftovers(id) {
		t.Errorf("after Destroy, left on the host: %s", l)
	}
}

// testPrefixIDs: ids that are prefixes of each other name different
// sandboxes (runtimes that accept abbreviated ids would mix them up).
func (s *suite) testPrefixIDs(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	short := s.newID("p")
	long := short + "0"
	s.mu.Lock()
	s.ids = append(s.ids, long)
	s.mu.Unlock()
	for _, id := range []string{long, short} {
		t.Cleanup(func() {
			if err := s.d.Destroy(ctxFor(t, destroyTimeout), id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		})
		if _, err := s.d.Create(ctx, sandbox.Spec{ID: id, Template: s.opts.MinimalTemplate}); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		s.sh(t, id, "echo "+id+" > /who")
	}
	for _, id := range []string{short, long} {
		if got := s.sh(t, id, "cat /who"); got != id+"\n" {
			t.Errorf("exec in %s reads /who = %q", id, got)
		}
	}
	if err := s.d.Kill(ctx, short); err != nil {
		t.Fatalf("Kill %s: %v", short, err)
	}
	if info, err := s.d.Inspect(ctx, long); err != nil || info.State != sandbox.StateRunning {
		t.Errorf("after Kill(%s), %s is %+v, %v", short, long, info, err)
	}
	if err := s.d.Destroy(ctx, short); err != nil {
		t.Fatalf("Destroy %s: %v", short, err)
	}
	if _, err := s.d.Exec(ctx, short, sandbox.ExecSpec{Args: []string{"true"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec(%s) after its Destroy = %v, want not found", short, err)
	}
	if got := s.sh(t, long, "cat /who"); got != long+"\n" {
		t.Errorf("%s after Destroy(%s): /who = %q", long, short, got)
	}
}

// testReattach: a new driver over the same state (a restarted daemon)
// finds a running sandbox, with its background process, and drives it.
func (s *suite) testReattach(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	id := s.create(t, "reattach", sandbox.Limits{})
	pid, err := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while :; do sleep 1; done"}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	d2 := s.newDriver(t)
	list, err := d2.List(ctx)
	if err != nil {
		t.Fatalf("new driver: List: %v", err)
	}
	i := slices.IndexFunc(list, func(in sandbox.Info) bool { return in.ID == id })
	if i < 0 || list[i].State != sandbox.StateRunning {
		t.Fatalf("new driver: List = %+v, want %s running", list, id)
	}
	var out lockedBuffer
	st, err := d2.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"echo", "again"}, Stdout: &out, Timeout: time.Minute})
	if err != nil || st.Code != 0 || out.String() != "again\n" {
		t.Fatalf("new driver: Exec = %+v, %v, %q", st, err, out.String())
	}
	procs, err := d2.Processes(ctx, id)
	if err != nil {
		t.Fatalf("new driver: Processes: %v", err)
	}
	if !slices.ContainsFunc(procs, func(p sandbox.Process) bool { return p.PID == pid }) {
		t.Errorf("new driver: Processes = %+v, want pid %d", procs, pid)
	}
}

// testKill: Kill leaves the sandbox stopped, its files kept and readable,
// and exec refused; Destroy still works (in cleanup).
func (s *suite) testKill(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	id := s.create(t, "kill", sandbox.Limits{})
	token := randToken("kept")
	s.sh(t, id, "mkdir -p /data && echo "+token+" > /data/kept")
	if _, err := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "3600"}}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	start := time.Now()
	if err := s.d.Kill(ctx, id); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	t.Logf("Kill took %v", time.Since(start).Round(time.Millisecond))
	info, err := s.d.Inspect(ctx, id)
	if err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("Inspect after Kill = %+v, %v; want stopped", info, err)
	}
	list, err := s.d.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	i := slices.IndexFunc(list, func(in sandbox.Info) bool { return in.ID == id })
	if i < 0 || list[i].State != sandbox.StateStopped {
		t.Errorf("List after Kill = %+v, want %s stopped", list, id)
	}
	got, err := readFile(t, s.files(t, id), "/data/kept")
	if err != nil || got != token+"\n" {
		t.Errorf("file after Kill = %q, %v; want %q", got, err, token+"\n")
	}
	if _, err := s.d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"true"}, Timeout: 30 * time.Second}); err == nil {
		t.Errorf("Exec in a killed sandbox succeeded")
	} else {
		t.Logf("Exec after Kill: %v", err)
	}
	// Kill again: harmless.
	if err := s.d.Kill(ctx, id); err != nil {
		t.Errorf("second Kill = %v", err)
	}
}
