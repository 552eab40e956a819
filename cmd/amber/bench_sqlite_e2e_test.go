package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/drivers/gvisor"
)

// The sqlite stacks of `make bench-restore` (docs/benchmarks.md, "The
// sandbox's own speed"): the sandbox's speed on a SQLite-heavy agent
// setup (testdata/sqlite/setup.py: 400,000 rows in /root, WAL,
// synchronous=FULL, a commit every 1,000 rows, an index, then a word count
// held in memory), timed from this process around the exec call, the
// stacks interleaved round by round:
//
//   - sqlite-native: the same script with the host's Debian python3
//     (/usr/bin/python3, the template's release) in a directory on the
//     filesystem the daemons' data lives on;
//   - sqlite-criu, sqlite-gvisor: a python-template sandbox of a daemon
//     with that driver, through REST;
//   - sqlite-gvisor+V1+V2…: the gvisor driver with runsc's options varied
//     through gvisor.RunscFlagsEnv (sqliteVariants names them).
//
// Every run must print the same summary line (the same rows, the same word
// counts). After the rounds each sandbox is cut, killed and recovered, and
// the database is checked in the restored sandbox (integrity_check, the
// rows and the word counts again): a variant that is fast but does not
// bring the database back is reported as such.
//
// Knobs: AMBER_BENCH_STACKS (names starting sqlite- select these stacks),
// AMBER_BENCH_SQLITE_N (rounds, default 3), AMBER_BENCH_SQLITE_ROWS
// (default 400000), AMBER_BENCH_SQLITE_CACHE_KIB (SQLite's page cache on
// every stack; unset, SQLite's default: an experiment, see setup.py).

// sqliteVariants are the runsc options a sqlite-gvisor+… stack may add
// (each replaces the default of its flag; drivers/gvisor/flags.go).
var sqliteVariants = map[string]string{
	"exclusive":  "--file-access=exclusive",
	"memory":     "--overlay2=root:memory",
	"self":       "--overlay2=root:self",
	"nodirectfs": "--directfs=false",
	"directfs":   "--directfs=true",
	"ptrace":     "--platform=ptrace",
}

// sqliteDefaultStacks run when AMBER_BENCH_STACKS is empty.
var sqliteDefaultStacks = []string{"sqlite-native", "sqlite-criu", "sqlite-gvisor"}

// sqliteStack is one place the setup runs.
type sqliteStack struct {
	name, flags string
	// run runs the setup (or, with check, only reads the database back)
	// and returns its output.
	run func(check bool) (string, error)
	// d, cl and id, for Amber stacks: the daemon, its client and the
	// sandbox.
	d  *daemon
	cl *client.Client
	id string
}

// close deletes the sandbox and stops the daemon, so that neither weighs
// on the benchmarks that follow.
func (s *sqliteStack) close() {
	if s.cl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.cl.DeleteSandbox(ctx, s.id)
	s.d.stop(syscall.SIGTERM)
}

type sqliteResult struct {
	walls              []time.Duration
	cut, recover       time.Duration
	exact, restoreNote string
}

// benchSQLite runs the sqlite stacks named and returns the report's table.
func benchSQLite(t *testing.T, bin, dir string, names []string) string {
	if len(names) == 0 {
		return ""
	}
	rounds := envInts(t, "AMBER_BENCH_SQLITE_N", []int{3})[0]
	rows := envInts(t, "AMBER_BENCH_SQLITE_ROWS", []int{400000})[0]
	script, err := os.ReadFile("testdata/sqlite/setup.py")
	if err != nil {
		t.Fatal(err)
	}
	var stacks []*sqliteStack
	for _, n := range names {
		if s := newSQLiteStack(t, bin, dir, n, script, rows); s != nil {
			stacks = append(stacks, s)
		}
	}
	t.Logf("sqlite: %d rows, %d rounds, load at the start %s", rows, rounds, loadAvg())
	res := map[string]*sqliteResult{}
	var want string
	for r := 1; r <= rounds; r++ {
		for _, s := range stacks {
			start := time.Now()
			out, err := s.run(false)
			wall := time.Since(start)
			if err != nil {
				t.Fatalf("%s, round %d: %v\n%s", s.name, r, err, out)
			}
			line := lastLine(out, "sqlite-setup ")
			if want == "" {
				want = line
			}
			if line == "" || line != want {
				t.Fatalf("%s, round %d: printed %q, want %q (every stack does the same work)", s.name, r, line, want)
			}
			if res[s.name] == nil {
				res[s.name] = &sqliteResult{}
			}
			res[s.name].walls = append(res[s.name].walls, wall)
			t.Logf("%-28s round %d: %v (load %s)", s.name, r, wall.Round(time.Millisecond), loadAvg())
		}
	}
	for _, s := range stacks {
		sqliteRestoreCheck(t, s, res[s.name], want)
		s.close()
		// A variant may break recovery (that is what the column is
		// for); the drivers as they ship must not.
		if s.flags == "default" && res[s.name].exact != "yes" {
			t.Errorf("%s: the database did not come back exactly: %s", s.name, res[s.name].restoreNote)
		}
	}
	t.Logf("sqlite: load at the end %s", loadAvg())
	cache := "SQLite's default (2 MiB)"
	if kib := os.Getenv("AMBER_BENCH_SQLITE_CACHE_KIB"); kib != "" {
		cache = kib + " KiB (AMBER_BENCH_SQLITE_CACHE_KIB)"
	}
	return fmt.Sprintf("SQLite setup, %d rows, page cache %s:\n\n", rows, cache) + formatSQLiteTable(stacks, res)
}

// newSQLiteStack builds stack name: nil (logged) for sqlite-native on a
// host without Debian's python3.
func newSQLiteStack(t *testing.T, bin, dir, name string, script []byte, rows int) *sqliteStack {
	args := func(check bool) []string {
		a := []string{"-", "/root", fmt.Sprint(rows)}
		if check {
			a = append(a, "check")
		}
		return a
	}
	var env []string // the script's
	if kib := os.Getenv("AMBER_BENCH_SQLITE_CACHE_KIB"); kib != "" {
		env = []string{"SQLITE_CACHE_KIB=" + kib}
	}
	if name == "sqlite-native" {
		const py = "/usr/bin/python3"
		if _, err := os.Stat(py); err != nil {
			t.Logf("sqlite-native: %v (install Debian's python3); the native reference is sqlite-criu", err)
			return nil
		}
		work := filepath.Join(dir, "sqlite-native")
		if err := os.MkdirAll(work, 0o700); err != nil {
			t.Fatal(err)
		}
		return &sqliteStack{name: name, flags: "-", run: func(check bool) (string, error) {
			a := args(check)
			a[1] = work
			cmd := exec.Command(py, a...)
			cmd.Env = append(os.Environ(), env...)
			cmd.Stdin = bytes.NewReader(script)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}}
	}
	driver, variant, _ := strings.Cut(strings.TrimPrefix(name, "sqlite-"), "+")
	if driver != "gvisor" && driver != "criu" || driver == "criu" && variant != "" {
		t.Fatalf("AMBER_BENCH_STACKS: unknown stack %q (sqlite-native, sqlite-criu, sqlite-gvisor[+variant…])", name)
	}
	var denv []string // the daemon's
	flags := "default"
	if variant != "" {
		var fl []string
		for _, v := range strings.Split(variant, "+") {
			f, ok := sqliteVariants[v]
			if !ok {
				t.Fatalf("AMBER_BENCH_STACKS: %s: unknown variant %q", name, v)
			}
			fl = append(fl, f)
		}
		flags = strings.Join(fl, " ")
		denv = []string{gvisor.RunscFlagsEnv + "=" + flags}
	}
	d := startDaemonEnv(t, bin, filepath.Join(dir, strings.ReplaceAll(name, "+", "_")), freeAddr(t), denv,
		"--driver", driver, "--pool", "0", "--egress=false")
	cl := d.adminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "python", Cold: true,
		Limits: api.Limits{MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatalf("%s: create: %v", name, err)
	}
	s := &sqliteStack{name: name, flags: flags, d: d, cl: cl, id: sb.ID}
	t.Cleanup(s.close) // before the daemon is killed (cleanups run last first)
	// The script goes in on stdin, not through Files: a variant with an
	// overlay inside gVisor does not see files written on the host.
	s.run = func(check bool) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		var out bytes.Buffer
		st, err := cl.Exec(ctx, s.id, api.ExecRequest{Args: append([]string{"python3"}, args(check)...),
			Env: env, Stdin: script, TimeoutMS: (15 * time.Minute).Milliseconds()}, nil, &out, &out)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("exit %d %s %s", st.Code, st.Signal, st.Reason)
		}
		return out.String(), err
	}
	return s
}

// sqliteRestoreCheck cuts, kills and recovers s's sandbox and checks the
// database in the restored one (the native stack has no restore).
func sqliteRestoreCheck(t *testing.T, s *sqliteStack, r *sqliteResult, want string) {
	if s.cl == nil {
		r.exact = "-"
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fail := func(step string, err error) {
		r.exact, r.restoreNote = "no", fmt.Sprintf("%s: %v", step, err)
		t.Logf("%s: restore check: %s", s.name, r.restoreNote)
	}
	start := time.Now()
	if _, err := s.cl.Checkpoint(ctx, s.id, api.CreateCheckpointRequest{}, nil); err != nil {
		fail("checkpoint", err)
		return
	}
	r.cut = time.Since(start)
	if _, err := s.cl.KillSandbox(ctx, s.id); err != nil {
		fail("kill", err)
		return
	}
	start = time.Now()
	if _, err := s.cl.Recover(ctx, s.id, api.RecoverRequest{}, nil); err != nil {
		fail("recover", err)
		return
	}
	r.recover = time.Since(start)
	out, err := s.run(true)
	if err != nil {
		fail("check after the restore", fmt.Errorf("%v: %s", err, tail(out, 3)))
		return
	}
	if got := lastLine(out, "sqlite-setup "); got != want {
		fail("check after the restore", fmt.Errorf("printed %q, want %q", got, want))
		return
	}
	r.exact = "yes"
	t.Logf("%s: checkpoint %v, recover %v, database exact after the restore", s.name, r.cut.Round(time.Millisecond), r.recover.Round(time.Millisecond))
}

// formatSQLiteTable prints one row per stack: the wall time's median (and
// range) and its ratios to sqlite-criu and sqlite-native of the same run.
func formatSQLiteTable(stacks []*sqliteStack, res map[string]*sqliteResult) string {
	med := map[string]time.Duration{}
	for n, r := range res {
		med[n] = medianOf(r.walls)
	}
	sec := func(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
	ratio := func(n, base string) string {
		if b, ok := med[base]; ok && b > 0 {
			return fmt.Sprintf("%.2f", float64(med[n])/float64(b))
		}
		return "-"
	}
	ms := func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return fmt.Sprint(d.Round(time.Millisecond).Milliseconds())
	}
	var b strings.Builder
	b.WriteString("| sqlite stack | runsc flags | n | wall p50 (min–max) s | ÷ criu | ÷ native | checkpoint / recover (ms) | database exact after restore |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, s := range stacks {
		r := res[s.name]
		fmt.Fprintf(&b, "| %s | %s | %d | %s (%s–%s) | %s | %s | %s / %s | %s %s |\n", s.name, s.flags, len(r.walls),
			sec(med[s.name]), sec(slices.Min(r.walls)), sec(slices.Max(r.walls)),
			ratio(s.name, "sqlite-criu"), ratio(s.name, "sqlite-native"), ms(r.cut), ms(r.recover), r.exact, r.restoreNote)
	}
	return b.String()
}
