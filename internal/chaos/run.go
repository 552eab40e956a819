package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

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
	sh, err := StartShop("")
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	defer sh.Close()
	args := []string{"--driver", c.o.Driver, "--pool", "0", "--log-level", "warn", "--watch-interval", "1s",
		"--egress-host", "shop.test=127.0.0.1", "--egress-allow", fmt.Sprintf("shop.test:%d", sh.Port)}
	dd := &Daemon{Dir: dir, Args: args}
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
		dd.Env = []string{"AMBER_TEST_FAILPOINT_LOG=" + fplog}
		if len(specs) > 0 {
			dd.Env = append(dd.Env, "AMBER_TEST_FAILPOINTS="+strings.Join(specs, ","))
		}
	}
	arm()
	keep := false
	defer func() {
		if !r.Identical && c.o.Keep && plan != nil && ctx.Err() == nil { // an interrupted run is not kept
			keep = true
		}
		if c.o.KeepSlow > 0 && r.slowest() > c.o.KeepSlow.Seconds() && ctx.Err() == nil {
			c.say("run seed %d: a fault took %.1fs to recover from: data kept in %s", seed, r.slowest(), dir)
			keep = true
		}
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if dd.Running() {
			if cl, err := dd.Client(); err == nil {
				if sbs, err := cl.ListSandboxes(cctx); err == nil {
					for _, sb := range sbs {
						if sb.State != "destroyed" {
							cl.DeleteSandbox(cctx, sb.ID)
						}
					}
				}
			}
		}
		dd.Stop()
		if plan == nil {
			c.calib = readHits(fplog)
		}
		if keep {
			r.Dir = dir
			return
		}
		UnmountUnder(dir)
		os.RemoveAll(dir)
	}()
	if err := dd.Start(); err != nil {
		r.Problem = err.Error()
		return r
	}
	cl, err := dd.Client()
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	shopURL := fmt.Sprintf("http://shop.test:%d", sh.Port)
	script := chaosScript(shopURL)
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
	runStart, ok := c.watch(ctx, r, seed, plan, st, dd, arm, cl, fplog, se.ID, wantAnswers)
	if !ok {
		return r
	}
	if plan == nil {
		c.goldenAnswers = st.answerTimes() // kills' moments are drawn within these gaps
	}
	stopReviving := c.revive(dd, fplog, r)
	defer stopReviving()
	return c.collect(ctx, r, plan, st, runStart, cl, se, ack, sh, shopURL, stopStream)
}

// revive restarts dd, with no failpoints, whenever it dies while the
// harness reads a finished run's outcome, until the returned stop: the
// uploads behind a session's last cuts go on after its last step, and a
// kill-daemon fault drawn at a chunk store step may end the daemon then,
// which a client would meet as a daemon being restarted.
func (c *chaos) revive(dd *Daemon, fplog string, r *chaosRun) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if dd.Running() {
				continue
			}
			c.say("run seed %d: the daemon ended after the session's last step: restarting it to read the outcome", r.Seed)
			dd.Env = []string{"AMBER_TEST_FAILPOINT_LOG=" + fplog}
			if err := dd.Start(); err != nil {
				c.say("run seed %d: restart the daemon: %v", r.Seed, err)
				continue
			}
			r.DaemonRestarts++
		}
	}()
	return func() { close(done); <-exited }
}

// watch follows a run until its session is done, needs reconciliation,
// times out or ctx ends (ok false: the run is over): it notes failpoint
// firings, does the harness's own kills at their moment, restarts a dead
// daemon (armed with the faults not yet seen) and nudges a stuck session.
func (c *chaos) watch(ctx context.Context, r *chaosRun, seed int64, plan []*chaosFault, st *chaosStream, dd *Daemon, arm func(), cl *client.Client, fplog, session string, wantAnswers int) (runStart time.Time, ok bool) {
	runStart = time.Now()
	fpSeen, startKills := 0, 0
	var lastNudge, doneAt time.Time
	deadline := runStart.Add(c.o.RunTimeout)
	for {
		now := time.Now()
		done, rec, lastAt := st.state(wantAnswers)
		r.Reconciliation = r.Reconciliation || rec
		if done {
			// The uploads behind the session's last cuts go on after its
			// last step: a store fault armed and not yet seen is given
			// chaosSettle to fire in them (the firings are read, a
			// killed daemon restarted, as during the run).
			r.Completed = true
			if doneAt.IsZero() {
				doneAt = now
			}
			if !unseenStoreFault(plan) || now.Sub(doneAt) > chaosSettle {
				break
			}
		}
		if rec {
			r.Problem = "the session needs reconciliation"
			break
		}
		if now.After(deadline) {
			r.Problem = fmt.Sprintf("the session did not finish within %s", c.o.RunTimeout)
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
			if c.kill(ctx, cl, dd, session, f.Class) {
				f.Hit, f.HitAtS = true, time.Since(runStart).Seconds()
			}
		}
		// A dead daemon is restarted, with the faults not yet seen.
		if !dd.Running() {
			c.rearm(plan, seed, r.DaemonRestarts+1, st.progress(wantAnswers))
			arm()
			err := dd.Start()
			if err != nil && dd.Killed() && startKills < 5 {
				// A kill-daemon fault fired while the daemon started (an
				// upload a previous life left pending, resumed at start):
				// one more daemon death, restarted on the next turn once
				// its firing is read (so it is not armed again).
				startKills++
				r.DaemonRestarts++
				continue
			}
			if err != nil {
				r.Problem = "restart daemon: " + err.Error()
				break
			}
			startKills = 0
			r.DaemonRestarts++
		}
		// A session that makes no progress for long (its Wake gave up
		// after store errors) is woken by a daemon restart.
		if !lastAt.IsZero() && now.Sub(lastAt) > chaosNudgeAfter && now.Sub(lastNudge) > chaosNudgeAfter {
			c.say("run seed %d: no progress for %s: restarting the daemon", seed, now.Sub(lastAt).Round(time.Second))
			dd.Stop()
			lastNudge = time.Now()
			r.Nudges++
			continue
		}
		select {
		case <-ctx.Done():
			r.Problem = ctx.Err().Error()
			return runStart, false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return runStart, true
}

// collect reads a finished run's outcome: recovery times, lost events,
// duplicated effects, the sandbox's state (brought back if it is not
// running), and the verdict against the golden run.
func (c *chaos) collect(ctx context.Context, r *chaosRun, plan []*chaosFault, st *chaosStream, runStart time.Time, cl *client.Client, se api.Session, ack api.Event, sh *Shop, shopURL string, stopStream context.CancelFunc) *chaosRun {
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
	err := retryServerErrors(ctx, func() error {
		got, err := cl.GetSession(ctx, se.ID)
		if err == nil {
			se = got // a failed call's empty answer kept the id from the next try
		}
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
	for item, n := range countItems(sh.Items()) {
		if n > 1 {
			r.DuplicateEffect = append(r.DuplicateEffect, fmt.Sprintf("%s booked %d times", item, n))
		}
	}
	sort.Strings(r.DuplicateEffect)
	if fx, err := cl.Effects(ctx, sessionSandbox(final, se.Sandbox)); err == nil && fx.NeedsReconciliation > 0 {
		r.Reconciliation = true
	}
	sbx := sessionSandbox(final, se.Sandbox)
	note, err := bringBack(ctx, cl, sbx, final)
	if err != nil {
		r.Problem = err.Error()
		return r
	}
	r.BroughtBack = note
	r.outcome = collectOutcome(ctx, cl, sbx, final, sh.Items(), shopURL)
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
func (c *chaos) kill(ctx context.Context, cl *client.Client, dd *Daemon, session, class string) bool {
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
		return dd.Kill() == nil
	case fcBothKill:
		if !killSandbox() {
			return false
		}
		return dd.Kill() == nil
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
	ckpt := newestCut(evs)
	if ckpt == "" {
		return "", fmt.Errorf("the session's sandbox %s is %s and the session has no checkpoint to bring it back from", sbx, sb.State)
	}
	if _, err := cl.Restore(ctx, ckpt, api.RestoreRequest{}, nil); err != nil {
		return "", fmt.Errorf("bring the session's sandbox %s (%s) back from %s: %w", sbx, sb.State, ckpt, err)
	}
	return fmt.Sprintf("sandbox %s was %s; restored from the session's checkpoint %s", sbx, sb.State, ckpt), nil
}

// newestCut is the session's newest step-boundary checkpoint, as its
// state folds it (internal/session State.Cut): a session.checkpointed
// event's, or (strict) a session.tool_result's own checkpoint — the one
// after each changing call — whichever is later; a new sandbox
// (session.sandbox_created) has none yet. The harness read only
// session.checkpointed events, so it brought a strict session's sandbox
// back to its first cut, not to the one after its last tool call (a
// harness defect: the outcome then differed from the golden one).
func newestCut(evs []api.Event) string {
	ckpt := ""
	for _, ev := range evs {
		var p struct {
			Checkpoint string `json:"checkpoint"`
		}
		switch ev.Type {
		case "session.sandbox_created":
			ckpt = ""
		case "session.checkpointed", "session.tool_result":
			if json.Unmarshal(ev.Payload, &p) == nil && p.Checkpoint != "" {
				ckpt = p.Checkpoint
			}
		}
	}
	return ckpt
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

// slowest is the longest recovery of r's observed faults, in seconds.
func (r *chaosRun) slowest() float64 {
	var m float64
	for _, f := range r.Faults {
		if f.recovered {
			m = max(m, f.RecoverS)
		}
	}
	return m
}

// chaosSettle is how long a finished run is watched further while a
// store fault armed in its daemon has not fired (watch).
const chaosSettle = 8 * time.Second

// unseenStoreFault reports whether a fault of plan armed at a failpoint
// has not been seen firing.
func unseenStoreFault(plan []*chaosFault) bool {
	for _, f := range plan {
		if f.Spec != "" && f.armed && !f.Hit {
			return true
		}
	}
	return false
}
