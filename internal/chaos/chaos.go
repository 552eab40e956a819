// Package chaos is the crash-anywhere exactness harness behind amber
// chaos. It runs the reference workload (workload.go) once without faults —
// the golden outcome — then again and again with faults drawn from a seed: SIGKILL of the
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
//
// The harness drives the amber binary it runs in: its daemons are `amber
// up` children (Daemon, daemon.go), and the outside world is a local shop
// (Shop, shop.go); amber demo and the e2e tests use both.
//
// May import: api, client, core, lib.
package chaos

import (
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
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

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
	// fcCutKill: the daemon killed at a step of a cut committed on the
	// node (the engine's upload.go): as the driver begins the cut
	// (driver.checkpoint), while the sandbox is frozen and its layer
	// archived (layer.archive.listed), once the hot copy is durable and before
	// the row commits (checkpoint.local-kept), or as the upload behind
	// the acknowledgement begins (checkpoint.upload).
	fcCutKill = "cut-kill"
)

// Classes are the fault classes, in the order the help and the report name them.
var Classes = []string{fcSandboxKill, fcDaemonKill, fcBothKill, fcTornCheckpoint, fcBlobErrors, fcDBErrors, fcDiskFull, fcSlowDisk, fcCutKill}

// Options are amber chaos's flags (cmd/amber binds them).
type Options struct {
	Seed    int64
	Faults  int
	PerRun  int
	Classes []string
	Driver  string
	Report  string
	Format  string
	MinHits int
	Keep    bool
	// KeepSlow, when > 0, also keeps the data directory of a run in
	// which a fault took longer than this to recover from (its daemon
	// log shows where the time went).
	KeepSlow   time.Duration
	RunTimeout time.Duration
	Budget     time.Duration
}

// UsageError is a mistake in how amber chaos was called (amber exits 2).
type UsageError struct{ error }

// Unwrap returns the mistake.
func (e UsageError) Unwrap() error { return e.error }

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

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

// Report is what amber chaos reports (text on stdout, JSON in --report).
type Report struct {
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
	o     *Options
	out   io.Writer
	start time.Time
	calib map[string]int // golden run's failpoint hit counts
	// goldenAnswers are when the golden run's model answers were streamed.
	goldenAnswers []time.Time
	golden        chaosOutcome
	goldD         time.Duration
}

func (c *chaos) say(format string, args ...any) {
	fmt.Fprintf(c.out, "[%6.1fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run runs the golden run and then o.Faults faults, o.PerRun per run, and
// reports to out (and o.Report); a mistake in o is a UsageError. It fails
// on a lost acknowledged event, a duplicated effect or a class hit fewer
// than o.MinHits times.
func Run(ctx context.Context, out io.Writer, o *Options) error {
	if os.Geteuid() != 0 {
		return errors.New("amber chaos runs sandboxes: run it as root")
	}
	if o.Faults < 1 || o.PerRun < 1 {
		return UsageError{errors.New("--faults and --faults-per-run must be at least 1")}
	}
	if o.Driver != "gvisor" && o.Driver != "criu" {
		return UsageError{fmt.Errorf("--driver %q: gvisor or criu", o.Driver)}
	}
	if o.Format != "text" && o.Format != "json" {
		return UsageError{fmt.Errorf("--format %q: text or json", o.Format)}
	}
	if len(o.Classes) == 0 {
		o.Classes = Classes
	}
	for _, cl := range o.Classes {
		if !contains(Classes, cl) {
			return UsageError{fmt.Errorf("--classes: unknown class %q (have %s)", cl, strings.Join(Classes, ", "))}
		}
	}
	// ^C or SIGTERM ends the run in progress cleanly: its sandboxes are
	// deleted and its daemon stopped.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &chaos{o: o, out: out, start: time.Now()}
	if o.Format == "json" {
		c.out = os.Stderr // progress; the report goes to stdout
	}
	c.say("amber chaos: driver %s, %d faults (%d per run), base seed %d, classes %s", o.Driver, o.Faults, o.PerRun, o.Seed, strings.Join(o.Classes, ","))

	g := c.runOnce(ctx, o.Seed, nil)
	if !g.Completed || g.Problem != "" {
		return fmt.Errorf("the golden run (no faults) did not complete: %s (dir %s)", g.Problem, g.Dir)
	}
	c.golden, c.goldD = g.outcome, time.Duration(g.DurationS*float64(time.Second))
	c.say("golden run: %.1fs, %d conversation items, ledger %v, failpoint hits %v", g.DurationS, len(c.golden.Conversation), c.golden.Ledger, c.calib)

	rep := &Report{Command: strings.Join(os.Args, " "), Driver: o.Driver, BaseSeed: o.Seed, Golden: c.golden, GoldenS: g.DurationS,
		PlannedByClass: map[string]int{}, HitsByClass: map[string]int{}}
	var recov []float64
	writeJSON := func() error {
		if o.Report == "" {
			return nil
		}
		b, _ := json.MarshalIndent(rep, "", "  ")
		return os.WriteFile(o.Report, append(b, '\n'), 0o644)
	}
	for i := 0; rep.FaultsPlanned < o.Faults; i++ {
		if ctx.Err() != nil {
			break // interrupted: report what ran
		}
		if o.Budget > 0 && time.Since(c.start) > o.Budget {
			rep.StoppedByBudget = true
			break
		}
		seed := o.Seed + int64(i)
		k := min(o.PerRun, o.Faults-rep.FaultsPlanned)
		plan := c.plan(seed, k)
		r := c.runOnce(ctx, seed, plan)
		if ctx.Err() != nil && !r.Completed {
			c.say("run %d (seed %d) interrupted: not counted", i+1, seed)
			break
		}
		rep.RunList = append(rep.RunList, r)
		rep.Runs++
		rep.SeedRange = [2]int64{o.Seed, seed}
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
	if o.Format == "json" {
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
	for _, cl := range o.Classes {
		if rep.PlannedByClass[cl] > 0 && rep.HitsByClass[cl] < o.MinHits {
			bad = append(bad, fmt.Sprintf("class %s observed %d times (want ≥ %d)", cl, rep.HitsByClass[cl], o.MinHits))
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

func writeChaosText(w io.Writer, r *Report) {
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
	for _, cl := range Classes {
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
	answers := len(chaosScript(""))
	for j := 0; j < k; j++ {
		cl := c.o.Classes[int((seed*int64(c.o.PerRun)+int64(j))%int64(len(c.o.Classes)))]
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
		// The hit number is drawn within the first quarter of the golden
		// run's count: the golden run is one daemon life, but a faulted
		// run's daemon is killed and restarted and each life counts its
		// failpoints from zero, so a hit late in the golden count was
		// never reached in a shorter life (classes observed 0 times in
		// clean runs, once the hot tier made restores read no blobs).
		n := func(point string) int { return 1 + rng.Intn(max(1, c.calib[point]/4)) }
		dur := func(lo, hi int) string { return fmt.Sprintf("%dms", lo+rng.Intn(hi-lo)) }
		switch cl {
		case fcSandboxKill, fcDaemonKill, fcBothKill:
			f.AtAnswer = 1 + rng.Intn(max(1, answers-2))
			f.AtMS = rng.Int63n(c.killWindowMS(f.AtAnswer))
		case fcTornCheckpoint:
			p := pick("blob.write", "chunkstore.chunks", "chunkstore.manifest", "chunkstore.publish")
			f.point, f.Spec = p, fmt.Sprintf("%s=%d:kill-daemon", p, n(p))
		case fcCutKill:
			p := pick("driver.checkpoint", "layer.archive.listed", "checkpoint.local-kept", "checkpoint.upload")
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

// killWindowMS bounds the moment of a kill the harness does itself, in
// milliseconds after the n-th model answer: 2 s, or less when the golden
// run went from that answer to its last one faster (half of that gap), so
// the moment comes before the run ends (a fast driver finished the last
// answers within 1.3 s, and its kill was never observed; a run after the
// golden one is faster still, its template already pushed: at 4/5 of the
// gap a criu daemon kill 724 ms after answer 5 came after the end).
func (c *chaos) killWindowMS(n int) int64 {
	w := int64(2000)
	if g := c.goldenAnswers; n >= 1 && n <= len(g) {
		w = min(w, max(1, g[len(g)-1].Sub(g[n-1]).Milliseconds()/2))
	}
	return w
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

// answerTimes returns when the stream showed each model answer.
func (s *chaosStream) answerTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for i, ev := range s.evs {
		if ev.Type == "session.assistant_message" {
			out = append(out, s.at[i])
		}
	}
	return out
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
