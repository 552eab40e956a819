package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// amber chaos: the crash-anywhere exactness harness. It runs the reference
// workload (chaos_workload.go) once without faults — the golden outcome —
// then again and again with faults drawn from a seed: SIGKILL of the
// sandbox, of the daemon, of both; a torn checkpoint upload (the daemon
// dies between a Put's chunks, manifest and pointer); the blob store or the
// event log failing for a while; disk full; a slow disk (the store faults
// through the failpoints of internal/host/faults and the chunk store, armed in
// the daemon from AMBER_TEST_FAILPOINTS). After each fault recovery is
// automatic: the harness restarts a dead daemon, which wakes the session.
// Every run's outcome is compared with the golden one; the report counts
// identical runs, runs that lost an acknowledged event, duplicated an
// effect or needed reconciliation, recovery times and confirmed hits per
// fault class, and prints each failing run's seed and diff.

// Fault classes.
const (
	fcSandboxKill    = "sandbox-kill"
	fcDaemonKill     = "daemon-kill"
	fcBothKill       = "both-kill"
	fcTornCheckpoint = "torn-checkpoint"
	fcBlobErrors     = "blob-errors"
	fcDBErrors       = "db-errors"
	fcDiskFull       = "disk-full"
	fcSlowDisk       = "slow-disk"
)

var chaosClasses = []string{fcSandboxKill, fcDaemonKill, fcBothKill, fcTornCheckpoint, fcBlobErrors, fcDBErrors, fcDiskFull, fcSlowDisk}

type chaosOptions struct {
	seed       int64
	faults     int
	perRun     int
	classes    []string
	driver     string
	report     string
	format     string
	minHits    int
	keep       bool
	runTimeout time.Duration
	budget     time.Duration
}

func newChaosCmd(g *globalFlags) *cobra.Command {
	o := &chaosOptions{}
	c := &cobra.Command{
		Use:   "chaos [--faults N] [--seed S] [--driver gvisor|criu] [--report FILE]",
		Short: "Inject faults at random moments into a reference agent session and check recovery is exact",
		Long: `Run the reference workload (a scripted agent session with a server holding
memory, a process tree, files, tmpfs, a SQLite database, HTTP orders to a
local ledger and a client following its events) once without faults — the
golden outcome — then in runs with faults at random moments drawn from the
seed: ` + strings.Join(chaosClasses, ", ") + `.
Each run's seed is the base seed plus its number; --seed RUNSEED --faults K
--faults-per-run K replays run RUNSEED alone. Recovery is automatic (a dead
daemon is restarted, which wakes the session). The report (text on stdout,
JSON in --report) counts identical runs, runs with a lost acknowledged event,
a duplicated effect or that needed reconciliation, recovery times, and
confirmed hits per fault class. Exit status 1 on any lost event or
duplicated effect, or a class hit fewer than --min-hits times. Runs as root
(it runs sandboxes), on this machine only.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("seed") {
				o.seed = time.Now().UnixNano() % 1_000_000_000
			}
			return runChaos(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := c.Flags()
	f.Int64Var(&o.seed, "seed", 0, "base seed (default: from the clock; printed)")
	f.IntVar(&o.faults, "faults", 20, "faults to inject in all")
	f.IntVar(&o.perRun, "faults-per-run", 4, "faults per run of the workload")
	f.StringSliceVar(&o.classes, "classes", nil, "fault classes (default all): "+strings.Join(chaosClasses, ","))
	f.StringVar(&o.driver, "driver", "gvisor", "sandbox driver: gvisor or criu (criu: no HTTP effects — it has no egress gateway yet)")
	f.StringVar(&o.report, "report", "", "also write the report as JSON to this file")
	f.StringVar(&o.format, "format", "text", "report on stdout: text or json")
	f.IntVar(&o.minHits, "min-hits", 1, "fail unless each class's fault was observed at least this many times")
	f.BoolVar(&o.keep, "keep", false, "keep the data directories of failing runs")
	f.DurationVar(&o.runTimeout, "run-timeout", 6*time.Minute, "give up on a run that has not finished after this long")
	f.DurationVar(&o.budget, "time-budget", 0, "start no new run after this long (0: none); the report says how many faults ran")
	_ = g
	return c
}

// chaosFault is one planned fault and what became of it.
type chaosFault struct {
	Class string `json:"class"`
	// Spec is the failpoint armed in the daemon ("point=N:action"); empty
	// for kills the harness does itself: AtMS after the session's
	// AtAnswer-th model answer was recorded (a moment tied to the run's
	// progress, so it lands inside the run however fast the machine is).
	Spec     string `json:"spec,omitempty"`
	AtMS     int64  `json:"at_ms,omitempty"`
	AtAnswer int    `json:"at_answer,omitempty"`
	// Hit: the fault was observed (the failpoint log, or the kill done).
	Hit       bool    `json:"hit"`
	HitAtS    float64 `json:"hit_at_s,omitempty"`
	RecoverS  float64 `json:"recover_s,omitempty"`
	recovered bool
	point     string // the failpoint
	action    string // what it does, after "point=N:"
	armed     bool
}

type chaosRun struct {
	Seed            int64         `json:"seed"`
	Faults          []*chaosFault `json:"faults"`
	DurationS       float64       `json:"duration_s"`
	Completed       bool          `json:"completed"`
	Identical       bool          `json:"identical"`
	LostEvents      []string      `json:"lost_events,omitempty"`
	DuplicateEffect []string      `json:"duplicated_effects,omitempty"`
	Reconciliation  bool          `json:"needed_reconciliation"`
	DaemonRestarts  int           `json:"daemon_restarts"`
	Nudges          int           `json:"nudges"`
	// BroughtBack says the session's sandbox was not running when the
	// session had finished (killed after its last tool call: the session
	// restores it only at its next one) and was restored in place from
	// the session's last checkpoint before its state was read.
	BroughtBack string   `json:"brought_back,omitempty"`
	Diff        []string `json:"diff,omitempty"`
	Problem     string   `json:"problem,omitempty"`
	Dir         string   `json:"dir,omitempty"`
	outcome     chaosOutcome
}

type chaosReport struct {
	Command             string         `json:"command"`
	Driver              string         `json:"driver"`
	BaseSeed            int64          `json:"base_seed"`
	SeedRange           [2]int64       `json:"seed_range"`
	Runs                int            `json:"runs"`
	Identical           int            `json:"identical_runs"`
	LostEventRuns       int            `json:"lost_event_runs"`
	DuplicateEffectRuns int            `json:"duplicated_effect_runs"`
	BroughtBackRuns     int            `json:"brought_back_runs"`
	ReconciliationRuns  int            `json:"reconciliation_runs"`
	IncompleteRuns      int            `json:"incomplete_runs"`
	NudgedRuns          int            `json:"nudged_runs"`
	StoppedByBudget     bool           `json:"stopped_by_time_budget,omitempty"`
	FaultsPlanned       int            `json:"faults_planned"`
	FaultsHit           int            `json:"faults_hit"`
	PlannedByClass      map[string]int `json:"planned_by_class"`
	HitsByClass         map[string]int `json:"hits_by_class"`
	RecoverP50S         float64        `json:"recover_p50_s"`
	RecoverP99S         float64        `json:"recover_p99_s"`
	GoldenS             float64        `json:"golden_s"`
	DurationS           float64        `json:"duration_s"`
	Golden              chaosOutcome   `json:"golden"`
	RunList             []*chaosRun    `json:"run_list"`
}

type chaos struct {
	o      *chaosOptions
	out    io.Writer
	start  time.Time
	calib  map[string]int // golden run's failpoint hit counts
	golden chaosOutcome
	goldD  time.Duration
}

func (c *chaos) say(format string, args ...any) {
	fmt.Fprintf(c.out, "[%6.1fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

func runChaos(ctx context.Context, out io.Writer, o *chaosOptions) error {
	if os.Geteuid() != 0 {
		return errors.New("amber chaos runs sandboxes: run it as root")
	}
	if o.faults < 1 || o.perRun < 1 {
		return usageError{errors.New("--faults and --faults-per-run must be at least 1")}
	}
	if o.driver != "gvisor" && o.driver != "criu" {
		return usageError{fmt.Errorf("--driver %q: gvisor or criu", o.driver)}
	}
	if o.format != "text" && o.format != "json" {
		return usageError{fmt.Errorf("--format %q: text or json", o.format)}
	}
	if len(o.classes) == 0 {
		o.classes = chaosClasses
	}
	for _, cl := range o.classes {
		if !contains(chaosClasses, cl) {
			return usageError{fmt.Errorf("--classes: unknown class %q (have %s)", cl, strings.Join(chaosClasses, ", "))}
		}
	}
	// ^C or SIGTERM ends the run in progress cleanly: its sandboxes are
	// deleted and its daemon stopped.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &chaos{o: o, out: out, start: time.Now()}
	if o.format == "json" {
		c.out = os.Stderr // progress; the report goes to stdout
	}
	c.say("amber chaos: driver %s, %d faults (%d per run), base seed %d, classes %s", o.driver, o.faults, o.perRun, o.seed, strings.Join(o.classes, ","))

	g := c.runOnce(ctx, o.seed, nil)
	if !g.Completed || g.Problem != "" {
		return fmt.Errorf("the golden run (no faults) did not complete: %s (dir %s)", g.Problem, g.Dir)
	}
	c.golden, c.goldD = g.outcome, time.Duration(g.DurationS*float64(time.Second))
	c.say("golden run: %.1fs, %d conversation items, ledger %v, failpoint hits %v", g.DurationS, len(c.golden.Conversation), c.golden.Ledger, c.calib)

	rep := &chaosReport{Command: strings.Join(os.Args, " "), Driver: o.driver, BaseSeed: o.seed, Golden: c.golden, GoldenS: g.DurationS,
		PlannedByClass: map[string]int{}, HitsByClass: map[string]int{}}
	var recov []float64
	writeJSON := func() error {
		if o.report == "" {
			return nil
		}
		b, _ := json.MarshalIndent(rep, "", "  ")
		return os.WriteFile(o.report, append(b, '\n'), 0o644)
	}
	for i := 0; rep.FaultsPlanned < o.faults; i++ {
		if ctx.Err() != nil {
			break // interrupted: report what ran
		}
		if o.budget > 0 && time.Since(c.start) > o.budget {
			rep.StoppedByBudget = true
			break
		}
		seed := o.seed + int64(i)
		k := min(o.perRun, o.faults-rep.FaultsPlanned)
		plan := c.plan(seed, k)
		r := c.runOnce(ctx, seed, plan)
		if ctx.Err() != nil && !r.Completed {
			c.say("run %d (seed %d) interrupted: not counted", i+1, seed)
			break
		}
		rep.RunList = append(rep.RunList, r)
		rep.Runs++
		rep.SeedRange = [2]int64{o.seed, seed}
		rep.FaultsPlanned += len(plan)
		for _, f := range r.Faults {
			rep.PlannedByClass[f.Class]++
			if f.Hit {
				rep.FaultsHit++
				rep.HitsByClass[f.Class]++
				if f.recovered {
					recov = append(recov, f.RecoverS)
				}
			}
		}
		switch {
		case r.Identical:
			rep.Identical++
		}
		if len(r.LostEvents) > 0 {
			rep.LostEventRuns++
		}
		if len(r.DuplicateEffect) > 0 {
			rep.DuplicateEffectRuns++
		}
		if r.Reconciliation {
			rep.ReconciliationRuns++
		}
		if !r.Completed {
			rep.IncompleteRuns++
		}
		if r.Nudges > 0 {
			rep.NudgedRuns++
		}
		if r.BroughtBack != "" {
			rep.BroughtBackRuns++
			c.say("run %d (seed %d): %s", i+1, seed, r.BroughtBack)
		}
		verdict := "identical"
		if !r.Identical {
			verdict = "DIFFERENT: " + firstNonEmpty(r.Problem, strings.Join(r.Diff, "; "))
		}
		c.say("run %d (seed %d): %s; faults %s", i+1, seed, verdict, describeFaults(r.Faults))
		rep.RecoverP50S, rep.RecoverP99S = percentile(recov, 50), percentile(recov, 99)
		rep.DurationS = time.Since(c.start).Seconds()
		if err := writeJSON(); err != nil { // after every run: an interrupted run leaves its report
			return err
		}
	}
	rep.RecoverP50S, rep.RecoverP99S = percentile(recov, 50), percentile(recov, 99)
	rep.DurationS = time.Since(c.start).Seconds()
	if err := writeJSON(); err != nil {
		return err
	}
	if o.format == "json" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintf(out, "%s\n", b)
	} else {
		writeChaosText(out, rep)
	}
	var bad []string
	if rep.LostEventRuns > 0 {
		bad = append(bad, fmt.Sprintf("%d runs lost an acknowledged event", rep.LostEventRuns))
	}
	if rep.DuplicateEffectRuns > 0 {
		bad = append(bad, fmt.Sprintf("%d runs duplicated an effect", rep.DuplicateEffectRuns))
	}
	for _, cl := range o.classes {
		if rep.PlannedByClass[cl] > 0 && rep.HitsByClass[cl] < o.minHits {
			bad = append(bad, fmt.Sprintf("class %s observed %d times (want ≥ %d)", cl, rep.HitsByClass[cl], o.minHits))
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

func writeChaosText(w io.Writer, r *chaosReport) {
	fmt.Fprintf(w, "\nChaos report — driver %s, seeds %d..%d (replay a run: amber chaos --driver %s --seed SEED --faults K --faults-per-run K)\n",
		r.Driver, r.SeedRange[0], r.SeedRange[1], r.Driver)
	fmt.Fprintf(w, "  runs                         %d (golden run %.1fs; all %.0fs)\n", r.Runs, r.GoldenS, r.DurationS)
	fmt.Fprintf(w, "  identical to golden          %d\n", r.Identical)
	fmt.Fprintf(w, "  lost an acknowledged event   %d\n", r.LostEventRuns)
	fmt.Fprintf(w, "  duplicated an effect         %d\n", r.DuplicateEffectRuns)
	fmt.Fprintf(w, "  needed reconciliation        %d\n", r.ReconciliationRuns)
	fmt.Fprintf(w, "  did not complete             %d\n", r.IncompleteRuns)
	fmt.Fprintf(w, "  woken by a daemon restart    %d (no progress for %s after a fault: the session's retries gave up)\n", r.NudgedRuns, chaosNudgeAfter)
	fmt.Fprintf(w, "  sandbox brought back to read %d (killed after the session's last tool call)\n", r.BroughtBackRuns)
	if r.StoppedByBudget {
		fmt.Fprintf(w, "  stopped by --time-budget after %d of the faults asked for\n", r.FaultsPlanned)
	}
	fmt.Fprintf(w, "  faults planned / observed    %d / %d\n", r.FaultsPlanned, r.FaultsHit)
	fmt.Fprintf(w, "  time to recover              p50 %.2fs, p99 %.2fs (fault → next recorded step)\n", r.RecoverP50S, r.RecoverP99S)
	fmt.Fprintf(w, "  observed / planned per class:\n")
	for _, cl := range chaosClasses {
		if r.PlannedByClass[cl] > 0 {
			fmt.Fprintf(w, "    %-16s %3d / %d\n", cl, r.HitsByClass[cl], r.PlannedByClass[cl])
		}
	}
	for _, run := range r.RunList {
		if run.Identical {
			continue
		}
		fmt.Fprintf(w, "  FAILED run, seed %d: faults %s\n", run.Seed, describeFaults(run.Faults))
		if run.Problem != "" {
			fmt.Fprintf(w, "    problem: %s\n", run.Problem)
		}
		for _, l := range run.LostEvents {
			fmt.Fprintf(w, "    lost: %s\n", l)
		}
		for _, l := range run.DuplicateEffect {
			fmt.Fprintf(w, "    duplicated: %s\n", l)
		}
		for _, l := range run.Diff {
			fmt.Fprintf(w, "    %s\n", l)
		}
		if run.Dir != "" {
			fmt.Fprintf(w, "    data kept in %s\n", run.Dir)
		}
	}
}

func describeFaults(fs []*chaosFault) string {
	var parts []string
	for _, f := range fs {
		what := f.Class
		if f.Spec != "" {
			what += "(" + f.Spec + ")"
		} else {
			what += fmt.Sprintf("(answer %d +%dms)", f.AtAnswer, f.AtMS)
		}
		if f.Hit {
			what += fmt.Sprintf(" hit@%.1fs", f.HitAtS)
			if f.recovered {
				what += fmt.Sprintf(" recovered %.1fs", f.RecoverS)
			}
		} else {
			what += " not-hit"
		}
		parts = append(parts, what)
	}
	return strings.Join(parts, ", ")
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(float64(len(s)-1)*p/100 + 0.5)
	return s[i]
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// plan draws the faults of the run with seed: classes in turn from the
// seed (consecutive seeds cover consecutive classes), moments from the seed
// within the golden run's duration, failpoint hit numbers within the
// golden run's counts, on distinct points.
func (c *chaos) plan(seed int64, k int) []*chaosFault {
	rng := rand.New(rand.NewSource(seed))
	used := map[string]bool{}
	var plan []*chaosFault
	answers := len(chaosScript("", c.o.driver == "gvisor"))
	for j := 0; j < k; j++ {
		cl := c.o.classes[int((seed*int64(c.o.perRun)+int64(j))%int64(len(c.o.classes)))]
		f := &chaosFault{Class: cl}
		pick := func(points ...string) string {
			var ok []string
			for _, p := range points {
				if !used[p] && c.calib[p] > 0 {
					ok = append(ok, p)
				}
			}
			if len(ok) == 0 {
				ok = points
			}
			p := ok[rng.Intn(len(ok))]
			used[p] = true
			return p
		}
		// The hit number is drawn within the first 4/5 of the golden run's
		// count, so the point is reached before the run ends.
		n := func(point string) int { return 1 + rng.Intn(max(1, c.calib[point]*4/5)) }
		dur := func(lo, hi int) string { return fmt.Sprintf("%dms", lo+rng.Intn(hi-lo)) }
		switch cl {
		case fcSandboxKill, fcDaemonKill, fcBothKill:
			f.AtAnswer, f.AtMS = 1+rng.Intn(max(1, answers-2)), rng.Int63n(2000)
		case fcTornCheckpoint:
			p := pick("blob.write", "chunkstore.chunks", "chunkstore.manifest", "chunkstore.publish")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:kill-daemon", p, n(p))
		case fcBlobErrors:
			p := pick("blob.write", "blob.read")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:error/%s", p, n(p), dur(500, 4000))
		case fcDBErrors:
			p := pick("eventlog.append", "eventlog.read", "meta.write", "meta.read")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:error/%s", p, n(p), dur(300, 3000))
		case fcDiskFull:
			p := pick("blob.write", "eventlog.append", "meta.write")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:enospc/%s", p, n(p), dur(500, 4000))
		case fcSlowDisk:
			p := pick("blob.write", "eventlog.append", "meta.write")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:slow/%s@%dms", p, n(p), dur(1000, 5000), 20+rng.Intn(180))
		}
		if f.Spec != "" {
			_, f.action, _ = strings.Cut(f.Spec, ":")
		}
		plan = append(plan, f)
	}
	return plan
}

// rearm draws again the hit numbers of the faults not yet observed when a
// daemon restarts mid-run (its points count from zero again, and less of
// the run is left: progress is the fraction done), from the run's seed and
// the restart's number.
func (c *chaos) rearm(plan []*chaosFault, seed int64, restart int, progress float64) {
	rng := rand.New(rand.NewSource(seed*1000 + int64(restart)))
	for _, f := range plan {
		if f.Spec == "" || f.Hit {
			continue
		}
		left := int(float64(c.calib[f.point]) * 4 / 5 * (1 - progress))
		f.Spec = fmt.Sprintf("%s=%d:%s", f.point, 1+rng.Intn(max(1, left)), f.action)
	}
}

// chaosStream follows the session's events over SSE across daemon
// restarts: the client of the workload, and the witness of what was
// acknowledged (an event a client was shown must never change or vanish).
type chaosStream struct {
	mu    sync.Mutex
	evs   []api.Event
	at    []time.Time
	seen  map[uint64]string
	twice []string
}

func (s *chaosStream) follow(ctx context.Context, cl *client.Client, id string) {
	var last uint64
	for ctx.Err() == nil {
		last, _ = cl.StreamSessionEvents(ctx, id, last, false, func(ev api.Event) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			sig := eventSig(ev)
			if prev, ok := s.seen[ev.Seq]; ok {
				s.twice = append(s.twice, fmt.Sprintf("seq %d delivered twice (%s, then %s)", ev.Seq, prev, sig))
				return nil
			}
			s.seen[ev.Seq] = sig
			s.evs = append(s.evs, ev)
			s.at = append(s.at, time.Now())
			return nil
		})
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func eventSig(ev api.Event) string {
	sum := sha256.Sum256(ev.Payload)
	return ev.ID + " " + ev.Type + " " + hex.EncodeToString(sum[:8])
}

// progressAfter returns when the first step (a model answer or tool result)
// was recorded after t, as the stream saw it.
func (s *chaosStream) progressAfter(t time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ev := range s.evs {
		if s.at[i].After(t) && (ev.Type == "session.assistant_message" || ev.Type == "session.tool_result") {
			return s.at[i], true
		}
	}
	return time.Time{}, false
}

// answerAt returns when the stream showed the n-th model answer.
func (s *chaosStream) answerAt(n int) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for i, ev := range s.evs {
		if ev.Type == "session.assistant_message" {
			if k++; k == n {
				return s.at[i], true
			}
		}
	}
	return time.Time{}, false
}

// progress is the fraction of the run's model answers recorded so far.
func (s *chaosStream) progress(want int) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range s.evs {
		if ev.Type == "session.assistant_message" {
			n++
		}
	}
	return min(1, float64(n)/float64(max(1, want)))
}

// state reports how far the session is, from the streamed events.
func (s *chaosStream) state(wantAnswers int) (done, reconcile bool, lastAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, status := 0, ""
	for _, ev := range s.evs {
		switch ev.Type {
		case "session.assistant_message":
			n++
		case "session.status":
			var st struct{ Status string }
			json.Unmarshal(ev.Payload, &st)
			status = st.Status
			reconcile = reconcile || st.Status == "needs-reconciliation"
		}
	}
	if len(s.at) > 0 {
		lastAt = s.at[len(s.at)-1]
	}
	return n >= wantAnswers && status == "idle", reconcile, lastAt
}

// runOnce runs the workload with plan's faults (none: the golden run, which
// also calibrates the failpoints' hit counts).
func (c *chaos) runOnce(ctx context.Context, seed int64, plan []*chaosFault) (r *chaosRun) {
	r = &chaosRun{Seed: seed, Faults: plan}
	start := time.Now()
	defer func() { r.DurationS = time.Since(start).Seconds() }()
	dir, err := os.MkdirTemp("", "amber-chaos-")
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	os.Chmod(dir, 0o711)
	fplog := filepath.Join(dir, "failpoints.log")
	sh, err := startShop("")
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	defer sh.close()
	effects := c.o.driver == "gvisor"
	args := []string{"--driver", c.o.driver, "--pool", "0", "--log-level", "warn", "--watch-interval", "1s"}
	if effects {
		args = append(args, "--egress-host", "shop.test=127.0.0.1", "--egress-allow", fmt.Sprintf("shop.test:%d", sh.port))
	}
	dd := &demoDaemon{dir: dir, args: args}
	// arm sets the failpoints of the next daemon: the run's faults not yet
	// observed (hit numbers count from the daemon's start).
	arm := func() {
		var specs []string
		for _, f := range plan {
			if f.Spec != "" && !f.Hit {
				f.armed = true
				specs = append(specs, f.Spec)
			}
		}
		dd.env = []string{"AMBER_TEST_FAILPOINT_LOG=" + fplog}
		if len(specs) > 0 {
			dd.env = append(dd.env, "AMBER_TEST_FAILPOINTS="+strings.Join(specs, ","))
		}
	}
	arm()
	keep := false
	defer func() {
		if !r.Identical && c.o.keep && plan != nil && ctx.Err() == nil { // an interrupted run is not kept
			keep = true
		}
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if dd.running() {
			if cl, err := dd.client(); err == nil {
				if sbs, err := cl.ListSandboxes(cctx); err == nil {
					for _, sb := range sbs {
						if sb.State != "destroyed" {
							cl.DeleteSandbox(cctx, sb.ID)
						}
					}
				}
			}
		}
		dd.stop()
		if plan == nil {
			c.calib = readHits(fplog)
		}
		if keep {
			r.Dir = dir
			return
		}
		unmountUnder(dir)
		os.RemoveAll(dir)
	}()
	if err := dd.start(); err != nil {
		r.Problem = err.Error()
		return r
	}
	cl, err := dd.client()
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	shopURL := fmt.Sprintf("http://shop.test:%d", sh.port)
	script := chaosScript(shopURL, effects)
	wantAnswers := len(script)
	// A client of a store that fails for a while tries again, as any
	// would: a session made twice is harmless (the other one stays idle),
	// and the message's event id makes its post idempotent.
	var se api.Session
	err = retryServerErrors(ctx, func() (err error) {
		se, err = cl.CreateSession(ctx, map[string]any{
			"model":    map[string]any{"adapter": "scripted", "script": script},
			"template": "python", "policy": "strict",
			"system": "You run errands from a sandbox and count every step.",
		})
		return err
	})
	if err != nil {
		r.Problem = "create session: " + err.Error()
		return r
	}
	sctx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	st := &chaosStream{seen: map[uint64]string{}}
	go st.follow(sctx, cl, se.ID)
	msg := api.PostSessionEventRequest{Type: "user_message", ID: "chaos-go", Payload: json.RawMessage(`{"text":"Run the errands."}`)}
	var ack api.Event
	err = retryServerErrors(ctx, func() (err error) {
		ack, err = cl.PostSessionEvent(ctx, se.ID, msg)
		return err
	})
	if err != nil {
		r.Problem = "post: " + err.Error()
		return r
	}
	runStart := time.Now()
	fpSeen := 0
	var lastNudge time.Time
	deadline := runStart.Add(c.o.runTimeout)
	for {
		now := time.Now()
		done, rec, lastAt := st.state(wantAnswers)
		r.Reconciliation = r.Reconciliation || rec
		if done {
			r.Completed = true
			break
		}
		if rec {
			r.Problem = "the session needs reconciliation"
			break
		}
		if now.After(deadline) {
			r.Problem = fmt.Sprintf("the session did not finish within %s", c.o.runTimeout)
			break
		}
		// Failpoint firings, as the daemon logged them.
		lines := readFiring(fplog)
		for _, l := range lines[fpSeen:] {
			for _, f := range plan {
				if f.armed && !f.Hit && f.point == l.point && strings.HasPrefix(f.action, l.action) {
					f.Hit, f.HitAtS = true, time.Since(runStart).Seconds()
				}
			}
		}
		fpSeen = len(lines)
		// Kills the harness does itself, at their moment.
		for _, f := range plan {
			if f.Spec != "" || f.Hit {
				continue
			}
			if at, ok := st.answerAt(f.AtAnswer); !ok || now.Sub(at) < time.Duration(f.AtMS)*time.Millisecond {
				continue
			}
			if c.kill(ctx, cl, dd, se.ID, f.Class) {
				f.Hit, f.HitAtS = true, time.Since(runStart).Seconds()
			}
		}
		// A dead daemon is restarted, with the faults not yet seen.
		if !dd.running() {
			c.rearm(plan, seed, r.DaemonRestarts+1, st.progress(wantAnswers))
			arm()
			if err := dd.start(); err != nil {
				r.Problem = "restart daemon: " + err.Error()
				break
			}
			r.DaemonRestarts++
		}
		// A session that makes no progress for long (its Wake gave up
		// after store errors) is woken by a daemon restart.
		if !lastAt.IsZero() && now.Sub(lastAt) > chaosNudgeAfter && now.Sub(lastNudge) > chaosNudgeAfter {
			c.say("run seed %d: no progress for %s: restarting the daemon", seed, now.Sub(lastAt).Round(time.Second))
			dd.stop()
			lastNudge = time.Now()
			r.Nudges++
			continue
		}
		select {
		case <-ctx.Done():
			r.Problem = ctx.Err().Error()
			return r
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Recovery times: from each observed fault to the next recorded step.
	for _, f := range plan {
		if !f.Hit {
			continue
		}
		at := runStart.Add(time.Duration(f.HitAtS * float64(time.Second)))
		if t, ok := st.progressAfter(at); ok {
			f.RecoverS, f.recovered = t.Sub(at).Seconds(), true
		}
	}
	if r.Problem != "" {
		return r
	}
	time.Sleep(300 * time.Millisecond) // let the stream catch up with the last events
	stopStream()
	// A store fault's window may still be open: the reads are retried as
	// the client's calls are.
	err = retryServerErrors(ctx, func() (err error) {
		se, err = cl.GetSession(ctx, se.ID)
		return err
	})
	if err != nil {
		r.Problem = "get session: " + err.Error()
		return r
	}
	var final []api.Event
	for after := uint64(0); ; {
		var l api.EventList
		err := retryServerErrors(ctx, func() (err error) {
			l, err = cl.SessionEvents(ctx, se.ID, after, 1000)
			return err
		})
		if err != nil {
			r.Problem = "read log: " + err.Error()
			return r
		}
		final = append(final, l.Events...)
		if len(l.Events) < 1000 {
			break
		}
		after = l.Events[len(l.Events)-1].Seq
	}
	r.LostEvents = lostEvents(st, final, ack)
	for item, n := range countItems(sh.items()) {
		if n > 1 {
			r.DuplicateEffect = append(r.DuplicateEffect, fmt.Sprintf("%s booked %d times", item, n))
		}
	}
	sort.Strings(r.DuplicateEffect)
	if effects {
		if fx, err := cl.Effects(ctx, sessionSandbox(final, se.Sandbox)); err == nil && fx.NeedsReconciliation > 0 {
			r.Reconciliation = true
		}
	}
	sbx := sessionSandbox(final, se.Sandbox)
	note, err := bringBack(ctx, cl, sbx, final)
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	r.BroughtBack = note
	r.outcome = collectOutcome(ctx, cl, sbx, final, sh.items(), shopURL)
	if plan != nil {
		r.Diff = diffOutcome(c.golden, r.outcome)
		r.Identical = len(r.Diff) == 0 && len(r.LostEvents) == 0 && len(r.DuplicateEffect) == 0 && !r.Reconciliation
	} else {
		r.Identical = true
	}
	return r
}

// chaosNudgeAfter is how long a run may make no progress before the
// harness restarts its daemon to wake the session (the harness's own
// retries after a store error are few and then wait for a client event).
const chaosNudgeAfter = 25 * time.Second

// kill does a harness-side fault; it says whether it was done.
func (c *chaos) kill(ctx context.Context, cl *client.Client, dd *demoDaemon, session, class string) bool {
	killSandbox := func() bool {
		l, err := cl.SessionEvents(ctx, session, 0, 1000)
		sbx := ""
		if err == nil {
			sbx = sessionSandbox(l.Events, "")
		}
		if sbx == "" {
			return false // no sandbox yet: try again at the next tick
		}
		_, err = cl.KillSandbox(ctx, sbx)
		return err == nil
	}
	switch class {
	case fcSandboxKill:
		return killSandbox()
	case fcDaemonKill:
		return dd.kill() == nil
	case fcBothKill:
		if !killSandbox() {
			return false
		}
		return dd.kill() == nil
	}
	return false
}

type fpFiring struct{ point, subject, action string }

// readFiring reads the failpoint log's firings ("point subject action").
func readFiring(path string) []fpFiring {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []fpFiring
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Fields(sc.Text())
		if len(p) == 3 && !strings.HasPrefix(p[0], "#") {
			out = append(out, fpFiring{p[0], p[1], p[2]})
		}
	}
	return out
}

// readHits reads the "#hits point N" lines a daemon wrote at shutdown.
func readHits(path string) map[string]int {
	out := map[string]int{}
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		var p string
		var n int
		if _, err := fmt.Sscanf(l, "#hits %s %d", &p, &n); err == nil {
			out[p] += n
		}
	}
	return out
}

// lostEvents compares what the client was shown (and the acknowledged
// post) with the final log: an acknowledged event must be there, at its
// position, unchanged; nothing may be delivered twice.
func lostEvents(st *chaosStream, final []api.Event, ack api.Event) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	bySeq := map[uint64]api.Event{}
	for _, ev := range final {
		bySeq[ev.Seq] = ev
	}
	var lost []string
	for _, ev := range st.evs {
		got, ok := bySeq[ev.Seq]
		if !ok {
			lost = append(lost, fmt.Sprintf("seq %d (%s) was streamed, is not in the log", ev.Seq, eventSig(ev)))
		} else if eventSig(got) != eventSig(ev) {
			lost = append(lost, fmt.Sprintf("seq %d was streamed as %s, the log has %s", ev.Seq, eventSig(ev), eventSig(got)))
		}
	}
	if got, ok := bySeq[ack.Seq]; !ok || got.ID != ack.ID {
		lost = append(lost, fmt.Sprintf("the acknowledged user message %s (seq %d) is not in the log", ack.ID, ack.Seq))
	}
	lost = append(lost, st.twice...)
	// A gap in what the stream delivered is an event it never showed.
	for i := 1; i < len(st.evs); i++ {
		if st.evs[i].Seq != st.evs[i-1].Seq+1 {
			lost = append(lost, fmt.Sprintf("the stream skipped from seq %d to %d", st.evs[i-1].Seq, st.evs[i].Seq))
		}
	}
	return lost
}

func countItems(items []string) map[string]int {
	m := map[string]int{}
	for _, it := range items {
		m[it]++
	}
	return m
}

// sessionSandbox is the session's current sandbox: the last one its log
// says it created or restored into (a restore may bring the sandbox back
// as a new one).
// bringBack restores session sandbox sbx in place from the session's last
// checkpoint when it is not running (see chaosRun.BroughtBack), as the
// session's next tool call would; it says what it did ("" when nothing).
func bringBack(ctx context.Context, cl *client.Client, sbx string, evs []api.Event) (string, error) {
	sb, err := cl.GetSandbox(ctx, sbx)
	if err != nil {
		return "", fmt.Errorf("get the session's sandbox: %w", err)
	}
	if sb.State == "running" {
		return "", nil
	}
	ckpt := ""
	for _, ev := range evs {
		if ev.Type == "session.checkpointed" {
			var p struct {
				Checkpoint string `json:"checkpoint"`
			}
			if json.Unmarshal(ev.Payload, &p) == nil && p.Checkpoint != "" {
				ckpt = p.Checkpoint
			}
		}
	}
	if ckpt == "" {
		return "", fmt.Errorf("the session's sandbox %s is %s and the session has no checkpoint to bring it back from", sbx, sb.State)
	}
	if _, err := cl.Restore(ctx, ckpt, api.RestoreRequest{}, nil); err != nil {
		return "", fmt.Errorf("bring the session's sandbox %s (%s) back from %s: %w", sbx, sb.State, ckpt, err)
	}
	return fmt.Sprintf("sandbox %s was %s; restored from the session's checkpoint %s", sbx, sb.State, ckpt), nil
}

func sessionSandbox(evs []api.Event, dflt string) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == "session.sandbox_created" || evs[i].Type == "session.sandbox_restored" {
			var p struct {
				Sandbox string `json:"sandbox"`
			}
			if json.Unmarshal(evs[i].Payload, &p) == nil && p.Sandbox != "" {
				return p.Sandbox
			}
		}
	}
	return dflt
}

// retryServerErrors calls f until it succeeds, fails with a client error
// (4xx: trying again would not help) or a minute has passed: a store
// fault injected into the daemon makes its calls fail with 5xx for a few
// seconds, and a client of a real service tries again.
func retryServerErrors(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		var ae *client.Error
		if err == nil || errors.As(err, &ae) && ae.Status < 500 || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
