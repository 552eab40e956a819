package session

import (
	"context"
	"errors"
	"fmt"
	"github.com/amber-run/amber/internal/obs/logging"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// Crash points of the harness (lib/failpoint), one at each side of
// each step's record.
const (
	FPModelBeforeRecord = "session.model.before-record" // the model answered; nothing recorded
	FPModelAfterRecord  = "session.model.after-record"  // the answer is durable; nothing acted on
	FPToolBeforeRecord  = "session.tool.before-record"  // the tool ran (strict: checkpoint committed); result not recorded
	FPToolAfterRecord   = "session.tool.after-record"   // the result is durable
	// FPSandboxBeforeRecord: a new sandbox runs; the log does not name it.
	FPSandboxBeforeRecord = "session.sandbox.before-record"
)

// Harness drives sessions. It holds no state of a session: Wake rebuilds it
// from the log, and every decision is taken on what the log says.
//
// # Durability order of a step
//
// Model call: session.model_request_started (intent) is appended before the
// request is sent; the answer is appended as one batch (model_request_ended
// with usage, assistant_message, one tool_call per call) before anything is
// done with it. A crash before the batch leaves an open call: the next Wake
// re-issues it (next attempt). After the batch, the answer is never
// requested again.
//
// Tool call: the call is in the log (the model's batch) and
// session.tool_started (intent, with the attempt) is appended before the
// tool runs. Under strict policy a tool that may change the sandbox is
// followed by a committed checkpoint, and only then is session.tool_result
// (naming that checkpoint) appended: an acknowledged step is always covered
// by a durable checkpoint. A crash before the result leaves a started call
// without result: the next Wake restores the sandbox to the checkpoint of
// the last acknowledged step (strict) and runs the call again; a call whose
// result is recorded is never run again. Under fast policy the sandbox is
// checkpointed at a step boundary every FastEvery changing steps, after the
// result is appended (session.checkpointed names the last result it
// covers); if the sandbox is lost, Wake restores the newest one and re-runs
// the recorded changing steps after it in order, reporting any whose output
// differs (session.divergence).
//
// Sandbox: a new one (the first, or a replacement for one lost before any
// checkpoint) is named in the log (session.sandbox_created or
// session.sandbox_restored) before anything runs in it or is cut of it,
// and is made with labels naming the session and which of its sandboxes
// it is (LabelSession, LabelSessionSandbox). A failed record or a crash
// before it leaves one the log does not name: the next attempt finds it by
// its labels and takes it (it is as a new one would be) or, if it no
// longer runs, destroys it and makes another (newSandbox).
//
// Status: every change of status is an event; the metadata row copies it
// after the append.
type Harness struct {
	Log      eventlog.Store
	Registry *eventlog.Registry
	Meta     metadata.Sessions // optional: status and sandbox copies
	Boxes    Sandboxes
	Models   ModelFactory
	Clock    clock.Clock
	Logger   *slog.Logger
	// Holder names this harness as the holder of session stream leases.
	Holder   string
	LeaseTTL time.Duration
	// Failpoints, when set, are evaluated at the FP* points.
	Failpoints *failpoint.Set
	// OnDelta, when set, gets the live text deltas of model answers.
	OnDelta func(session, text string)
	// Secrets resolves a definition's api_key_secret (nil: none can).
	Secrets SecretSource
	// Providers are the operator's model providers by name (amber up
	// --model-provider): the only way an operator's key is ever used.
	Providers map[string]Provider
	// EgressAllows decides whether tenant's egress policy lets it reach
	// host:port. A model endpoint the tenant chose (model.base_url, or an
	// adapter's public endpoint) is asked before the model is first
	// called, so model traffic passes the same allowlist as the tenant's
	// sandboxes' requests (and, at dial time, the same deny list). An
	// operator's provider is not asked. nil: not checked.
	EgressAllows func(ctx context.Context, tenant, host string, port uint16) (bool, error)
	// Owns tells whether this daemon runs session se (nil: every
	// session). Many nodes on shared stores: a session runs on the node
	// that runs its sandbox (Manager.Start wakes only those).
	Owns func(ctx context.Context, se meta.Session) bool
}

// ErrWaiting is not an error: Wake returns nil when the session waits.

// Wake rebuilds session id from its log and continues it until it waits
// for input (idle, a custom tool result or a confirmation), is paused by a
// budget, is terminated, or ctx ends. It returns the status it left the
// session in.
func (h *Harness) Wake(ctx context.Context, id string) (Status, error) {
	h.defaults()
	r := &run{h: h, id: id, stream: Stream(id), st: NewState(id)}
	if err := r.refresh(ctx); err != nil {
		return "", err
	}
	if r.st.Def.Model.Adapter == "" {
		return "", errdefs.NotFoundf("session %s has no created event", id)
	}
	// Every line logged with this context (the engine's too: the tools'
	// calls carry it) names the session and its tenant.
	ctx = logging.With(ctx, logging.SessionID, id, logging.TenantID, r.st.Tenant)
	actx, cancel := context.WithTimeout(ctx, leaseCallTimeout(h.LeaseTTL))
	l, err := h.Log.Acquire(actx, r.stream, h.Holder, h.LeaseTTL)
	cancel()
	if err != nil {
		return "", fmt.Errorf("session %s: lease: %w", id, err)
	}
	r.lease = l
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		r.mu.Lock()
		_ = h.Log.Release(rctx, r.lease)
		r.mu.Unlock()
	}()
	return r.loop(ctx)
}

// openModel makes the session's model adapter, at the first model call of
// a Wake. The definition goes through the same check as a new one
// (resolveModel), whatever binary wrote it: a definition already in the log
// that names the daemon's environment (api_key_env) or a provider this
// tenant may no longer use is refused here, never sent anywhere.
func (r *run) openModel(ctx context.Context) error {
	mc, err := resolveModel(ctx, r.h.Providers, r.h.Secrets, r.st.Tenant, r.st.Def.Model)
	if err == nil && !mc.ep.trusted && mc.ep.url != "" && r.h.EgressAllows != nil {
		err = checkModelEgress(ctx, r.h.EgressAllows, r.st.Tenant, mc.ep.url)
	}
	if err == nil {
		r.model, err = r.h.Models(mc)
	}
	return err
}

// checkModelEgress refuses a tenant's model endpoint that its egress
// policy does not allow (PermissionDenied: the session records it and
// waits; a client event after the policy changed tries again).
func checkModelEgress(ctx context.Context, allows func(ctx context.Context, tenant, host string, port uint16) (bool, error), tenant, base string) error {
	u, err := url.Parse(base)
	if err != nil || u.Hostname() == "" {
		return errdefs.InvalidArgumentf("model base URL %q does not parse", base)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return errdefs.InvalidArgumentf("model base URL %q: port %q", base, port)
	}
	ok, err := allows(ctx, tenant, u.Hostname(), uint16(n))
	if err != nil {
		return fmt.Errorf("model endpoint %s:%d: egress policy of tenant %s: %w", u.Hostname(), n, tenant, err)
	}
	if !ok {
		return errdefs.PermissionDeniedf("model endpoint %s:%d is not in tenant %s's egress allowlist (the operator's --model-provider, or an allow pattern in the tenant's egress policy, reaches it)", u.Hostname(), n, tenant)
	}
	return nil
}

// refuseModel records why the session's model settings are refused (once
// per client event) and leaves the session idle: retrying cannot change an
// immutable definition, so the session waits for a client (which may
// terminate it).
func (r *run) refuseModel(ctx context.Context, err error) (Status, error) {
	reason := "model settings refused: " + err.Error()
	if st := r.st; st.Status == StatusIdle && st.StatusReason == reason && st.LastInput < st.StatusSeq {
		return StatusIdle, nil // recorded already, and no client event since
	}
	if _, aerr := r.appendEvents(ctx, r.event(fmt.Sprintf("error.model-settings.%d", r.st.Head), EventError,
		ErrorInfo{During: "model settings", Kind: errdefs.Kind(err), Message: err.Error()})); aerr != nil {
		return r.st.Status, aerr
	}
	if serr := r.setStatus(ctx, StatusIdle, reason); serr != nil {
		return r.st.Status, serr
	}
	return StatusIdle, nil
}

func (h *Harness) defaults() {
	if h.Clock == nil {
		h.Clock = clock.Real{}
	}
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	if h.Models == nil {
		h.Models = NewModel
	}
	if h.Holder == "" {
		h.Holder = "harness"
	}
	if h.LeaseTTL <= 0 {
		h.LeaseTTL = 30 * time.Second
	}
}

// run is one Wake: a cache of the log's fold, refreshed before every
// decision, and the lease it writes under.
type run struct {
	h      *Harness
	id     string
	stream string
	st     *State
	model  Model

	mu        sync.Mutex
	lease     eventlog.Lease
	renewed   time.Time
	recovered bool
}

// refresh folds the events appended since the last read.
func (r *run) refresh(ctx context.Context) error {
	for {
		evs, err := r.h.Log.Read(ctx, r.stream, r.st.Head+1, 512)
		if err != nil {
			return logError{fmt.Errorf("session %s: read: %w", r.id, err)}
		}
		for _, ev := range evs {
			if ev, err = r.h.Registry.Upcast(ev); err != nil {
				return err
			}
			if err := r.st.Apply(ev); err != nil {
				return err
			}
		}
		if len(evs) < 512 {
			return nil
		}
	}
}

// appendEvents appends under the harness's lease (renewing it when a third
// of its time has passed) and folds the result back in.
func (r *run) appendEvents(ctx context.Context, evs ...eventlog.Event) (eventlog.AppendResult, error) {
	r.mu.Lock()
	if r.h.Clock.Now().Sub(r.renewed) > r.h.LeaseTTL/3 {
		rctx, cancel := context.WithTimeout(ctx, leaseCallTimeout(r.h.LeaseTTL))
		l, err := r.h.Log.Renew(rctx, r.lease, r.h.LeaseTTL)
		cancel()
		if err != nil {
			r.mu.Unlock()
			return eventlog.AppendResult{}, fmt.Errorf("session %s: renew lease: %w", r.id, err)
		}
		r.lease, r.renewed = l, r.h.Clock.Now()
	}
	epoch := r.lease.Epoch
	r.mu.Unlock()
	for i := range evs {
		evs[i].Tenant, evs[i].Stream = r.st.Tenant, r.stream
		if v, ok := r.h.Registry.Current(evs[i].Type); ok {
			evs[i].Version = v
		}
	}
	res, err := r.h.Log.Append(ctx, r.stream, epoch, eventlog.Any, evs...)
	if err != nil {
		return res, logError{fmt.Errorf("session %s: append %s: %w", r.id, evs[0].Type, err)}
	}
	return res, r.refresh(ctx)
}

// logError is a failed append to or read of the session's log: an error
// of the log, never of the step being recorded.
type logError struct{ error }

func (e logError) Unwrap() error { return e.error }

// leaseCallTimeout bounds one Acquire or Renew of a session's lease
// (a third of its TTL): a lease call that hangs (a log that stopped
// answering) fails the Wake, which the Manager tries again in a second or
// two, instead of holding the session until a restart.
func leaseCallTimeout(ttl time.Duration) time.Duration { return max(ttl/3, 100*time.Millisecond) }

func (r *run) event(id, typ string, payload any) eventlog.Event {
	return eventlog.Event{ID: r.id + "." + id, Type: typ, Payload: mustJSON(payload)}
}

// setStatus appends a status event when the status changes (id: the log
// position it was decided at, so a retry is a no-op).
func (r *run) setStatus(ctx context.Context, s Status, reason string) error {
	if r.st.Status == s && r.st.StatusReason == reason {
		return nil
	}
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("status.%d", r.st.Head), EventStatus, StatusChange{Status: s, Reason: reason})); err != nil {
		return err
	}
	if r.h.Meta != nil {
		if err := r.h.Meta.SetSessionStatus(ctx, r.id, string(s), reason); err != nil {
			r.h.Logger.WarnContext(ctx, "session status row", "session", r.id, "err", err)
		}
	}
	return nil
}

func (r *run) recordError(ctx context.Context, during string, err error) {
	if ctx.Err() != nil || errors.Is(err, failpoint.ErrCrash) {
		return
	}
	_, _ = r.appendEvents(ctx, r.event(fmt.Sprintf("error.%d", r.st.Head), EventError, ErrorInfo{During: during, Kind: errdefs.Kind(err), Message: err.Error()}))
}

// loop decides and performs one step at a time until the session waits.
func (r *run) loop(ctx context.Context) (Status, error) {
	for {
		if err := ctx.Err(); err != nil {
			return r.st.Status, err
		}
		if err := r.refresh(ctx); err != nil {
			return r.st.Status, err
		}
		st := r.st
		switch {
		case st.Terminated:
			if err := r.setStatus(ctx, StatusTerminated, "terminated on request"); err != nil {
				return st.Status, err
			}
			if st.Sandbox != "" {
				if err := r.h.Boxes.Destroy(ctx, st.Tenant, st.Sandbox); err != nil && !errdefs.IsNotFound(err) {
					r.h.Logger.WarnContext(ctx, "destroy session sandbox", "session", r.id, "sandbox", st.Sandbox, "err", err)
				}
			}
			r.destroyLabeled(ctx)
			return StatusTerminated, nil
		case st.Status == StatusTerminated:
			return StatusTerminated, nil
		case st.Interrupted:
			// Jumps the queue: pending calls are answered as interrupted. A
			// changing call that had started (a crash cut it off) may have
			// half-changed the sandbox: it is first brought back to the last
			// acknowledged step, as before a re-run.
			if len(st.cutOff()) > 0 && st.Sandbox != "" {
				if _, err := r.sandbox(ctx); err != nil {
					return r.st.Status, err
				}
			}
			for _, c := range slices.Clone(r.st.Pending) {
				out := "interrupted by the user before it ran"
				if r.st.ToolAttempts[c.ID] > 0 {
					out = "interrupted by the user before it completed"
				}
				if _, err := r.appendEvents(ctx, r.event("t."+c.ID+".result", EventToolResult,
					ToolResult{ToolCallID: c.ID, Name: c.Name, Output: out, IsError: true})); err != nil {
					return r.st.Status, err
				}
			}
			if err := r.setStatus(ctx, StatusIdle, "interrupted"); err != nil {
				return st.Status, err
			}
			return StatusIdle, nil
		case st.Status == StatusNeedsReconciliation && st.LastInput < st.StatusSeq:
			// Stays so until a client event (e.g. resume) asks to try again.
			return st.Status, nil
		case len(st.Pending) > 0:
			c := st.Pending[0]
			wait, err := r.tool(ctx, c)
			if err != nil {
				r.recordError(ctx, "tool "+c.Name, err)
				return r.st.Status, err
			}
			if wait != "" {
				if err := r.setStatus(ctx, StatusWaiting, wait); err != nil {
					return st.Status, err
				}
				return StatusWaiting, nil
			}
		case st.NeedsModel():
			if why := st.OverBudget(r.h.Clock.Now()); why != "" {
				if err := r.setStatus(ctx, StatusPausedBudget, why); err != nil {
					return st.Status, err
				}
				return StatusPausedBudget, nil
			}
			if r.model == nil {
				if err := r.openModel(ctx); err != nil {
					if lasting(err) || errdefs.IsNotFound(err) {
						return r.refuseModel(ctx, err)
					}
					return st.Status, err
				}
			}
			if err := r.setStatus(ctx, StatusRunning, ""); err != nil {
				return st.Status, err
			}
			if err := r.callModel(ctx); err != nil {
				r.recordError(ctx, "model call", err)
				return r.st.Status, err
			}
		default:
			if err := r.setStatus(ctx, StatusIdle, ""); err != nil {
				return st.Status, err
			}
			return StatusIdle, nil
		}
	}
}

// callModel makes the next model call (re-issuing one cut off).
func (r *run) callModel(ctx context.Context) error {
	st := r.st
	call, attempt := st.Calls+1, 1
	if st.Open != nil && st.Open.Call == call {
		attempt = st.Open.Attempt + 1
	}
	msgs, compacted := buildContext(st.Messages, st.Def.ContextBudget)
	name := st.Def.Model.Name
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("m%d.a%d.start", call, attempt), EventModelRequestStarted,
		ModelRequestStarted{Call: call, Attempt: attempt, Model: name, ContextMessages: len(msgs), Compacted: compacted})); err != nil {
		return err
	}
	maxTok := st.Def.Model.MaxTokens
	if maxTok <= 0 {
		maxTok = 4096
	}
	var onDelta func(string)
	if r.h.OnDelta != nil {
		onDelta = func(s string) { r.h.OnDelta(r.id, s) }
	}
	resp, err := r.model.Complete(ctx, Request{Model: name, System: st.Def.System, Messages: msgs,
		Tools: toolSpecs(st.Def), MaxTokens: maxTok, Turn: st.Calls}, onDelta)
	if err != nil {
		return fmt.Errorf("model call %d: %w", call, err)
	}
	if err := r.h.Failpoints.Eval(FPModelBeforeRecord); err != nil {
		return err
	}
	for i := range resp.ToolCalls {
		if resp.ToolCalls[i].ID == "" {
			resp.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", call, i+1)
		}
		if len(resp.ToolCalls[i].Input) == 0 {
			resp.ToolCalls[i].Input = []byte(`{}`)
		}
	}
	evs := []eventlog.Event{
		r.event(fmt.Sprintf("m%d.end", call), EventModelRequestEnded, ModelRequestEnded{Call: call, Attempt: attempt, Usage: resp.Usage, StopReason: resp.StopReason}),
		r.event(fmt.Sprintf("m%d.msg", call), EventAssistantMessage, AssistantMessage{Call: call, Text: resp.Text, ToolCalls: resp.ToolCalls}),
	}
	for i, c := range resp.ToolCalls {
		evs = append(evs, r.event(fmt.Sprintf("m%d.tc%d", call, i+1), EventToolCall, c))
	}
	if _, err := r.appendEvents(ctx, evs...); err != nil {
		return err
	}
	return r.h.Failpoints.Eval(FPModelAfterRecord)
}

// tool handles the first pending tool call. It returns a reason to wait
// (for a confirmation or a custom tool's result) or runs it and records
// its result.
func (r *run) tool(ctx context.Context, c ToolCall) (wait string, err error) {
	st := r.st
	result := func(out string, isErr bool) error {
		_, err := r.appendEvents(ctx, r.event("t."+c.ID+".result", EventToolResult, ToolResult{ToolCallID: c.ID, Name: c.Name, Output: out, IsError: isErr}))
		return err
	}
	if slices.Contains(st.Def.Confirm, c.Name) {
		conf, ok := st.Confirmed[c.ID]
		if !ok {
			return "confirmation of tool call " + c.ID + " (" + c.Name + ")", nil
		}
		if !conf.Allow {
			return "", result("the user denied this tool call: "+conf.Reason, true)
		}
	}
	if st.Def.isCustom(c.Name) {
		cr, ok := st.Custom[c.ID]
		if !ok {
			return "result of custom tool call " + c.ID + " (" + c.Name + ")", nil
		}
		return "", result(cr.Output, cr.IsError)
	}
	if !slices.Contains(st.Def.Tools, c.Name) {
		return "", result(fmt.Sprintf("unknown tool %q", c.Name), true)
	}
	if err := r.setStatus(ctx, StatusRunning, ""); err != nil {
		return "", err
	}
	sbx, err := r.sandbox(ctx)
	if err != nil {
		return "", err
	}
	if sbx == "" { // needs reconciliation
		return "", nil
	}
	attempt := st.ToolAttempts[c.ID] + 1
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("t.%s.a%d.start", c.ID, attempt), EventToolStarted, ToolStarted{ToolCallID: c.ID, Attempt: attempt})); err != nil {
		return "", err
	}
	out, isErr, err := runTool(ctx, r.h.Boxes, st.Tenant, sbx, c)
	if err != nil {
		return "", fmt.Errorf("tool call %s (%s): %w", c.ID, c.Name, err)
	}
	res := ToolResult{ToolCallID: c.ID, Name: c.Name, Output: out, IsError: isErr, Changed: changes(c.Name)}
	if res.Changed && st.Def.Policy == PolicyStrict {
		// Strict: the step is acknowledged only once a checkpoint covering
		// it is durable.
		ck, err := r.h.Boxes.Checkpoint(ctx, st.Tenant, sbx)
		if err != nil {
			return "", fmt.Errorf("checkpoint after tool call %s: %w", c.ID, err)
		}
		res.Checkpoint = ck
	}
	if err := r.h.Failpoints.Eval(FPToolBeforeRecord); err != nil {
		return "", err
	}
	if _, err := r.appendEvents(ctx, r.event("t."+c.ID+".result", EventToolResult, res)); err != nil {
		return "", err
	}
	if err := r.h.Failpoints.Eval(FPToolAfterRecord); err != nil {
		return "", err
	}
	if st.Def.Policy == PolicyFast && r.st.ChangedSinceCut >= st.Def.FastEvery && len(r.st.Pending) == 0 {
		r.fastCheckpoint(ctx, sbx)
	}
	return "", nil
}

// firstCut checkpoints a new sandbox before its first tool call and records
// it as the session's cut, so that a lost sandbox is always brought back
// in place (the same id, from this cut) rather than made anew. That keeps
// its effects exact: the egress gateway keys a request by the sandbox and
// the cut its run started from, so a tool call cut off before any other
// checkpoint re-sends its request under the same key (and the same
// Idempotency-Key) instead of as a new effect of a new sandbox.
//
// Under the strict policy a failure fails the Wake (the manager retries it
// with backoff, and the next Wake cuts again before any tool runs): strict
// needs a cut after every changing step anyway, and a tool call made
// without one could be repeated as a new effect. Under fast it is recorded
// and the session goes on (a loss before the next cut then makes a new
// sandbox).
func (r *run) firstCut(ctx context.Context, sbx string) error {
	strict := r.st.Def.Policy == PolicyStrict
	after := r.st.Head
	ck, err := r.h.Boxes.Checkpoint(ctx, r.st.Tenant, sbx)
	if err != nil {
		if errors.Is(err, failpoint.ErrCrash) || ctx.Err() != nil {
			return err
		}
		r.recordError(ctx, "first checkpoint", err)
		if strict {
			return fmt.Errorf("first checkpoint of %s: %w", sbx, err)
		}
		return nil
	}
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("ckpt.%d", after), EventCheckpointed, Checkpointed{Checkpoint: ck, Sandbox: sbx, AfterSeq: after})); err != nil {
		if strict {
			return err
		}
		r.h.Logger.WarnContext(ctx, "record the first checkpoint", "session", r.id, "err", err)
	}
	return nil
}

// fastCheckpoint cuts a checkpoint at this step boundary (fast policy). A
// failure is recorded and the session goes on: the next one covers more.
func (r *run) fastCheckpoint(ctx context.Context, sbx string) {
	after := r.st.Head
	ck, err := r.h.Boxes.Checkpoint(ctx, r.st.Tenant, sbx)
	if err != nil {
		r.recordError(ctx, "fast checkpoint", err)
		return
	}
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("ckpt.%d", after), EventCheckpointed, Checkpointed{Checkpoint: ck, Sandbox: sbx, AfterSeq: after})); err != nil {
		r.h.Logger.WarnContext(ctx, "record fast checkpoint", "session", r.id, "err", err)
	}
}

// sandbox returns the session's sandbox, ready for the next tool call:
// made at the first call that needs one; at the first call of a Wake,
// brought back to the log's position if it was lost or a call was cut off
// (recover). "" means the session now needs reconciliation.
func (r *run) sandbox(ctx context.Context) (string, error) {
	st := r.st
	if st.Sandbox == "" {
		id, err := r.newSandbox(ctx)
		if err != nil {
			return "", err
		}
		if _, err := r.appendEvents(ctx, r.event("sandbox."+id, EventSandboxCreated, SandboxCreated{Sandbox: id, Template: st.Def.Template})); err != nil {
			return "", err
		}
		r.recovered = true
		if r.h.Meta != nil {
			_ = r.h.Meta.SetSessionSandbox(ctx, r.id, id)
		}
		if err := r.firstCut(ctx, id); err != nil {
			return "", err
		}
		return id, nil
	}
	if r.recovered {
		return st.Sandbox, nil
	}
	if err := r.recover(ctx); err != nil {
		if errors.Is(err, failpoint.ErrCrash) || ctx.Err() != nil {
			return "", err
		}
		if errdefs.IsUnavailable(err) || errdefs.IsNoSpace(err) || errors.As(err, new(logError)) {
			// A store down or full for a while (the session's own log
			// full or failing included: that says nothing of the
			// sandbox; a metadata store's ENOSPC under the restore: the
			// chaos run's seeds 261117 and 261119 ended needing a person
			// for it), a runtime slow to let a sandbox go: the Wake is
			// retried with backoff (Manager), and the session stays
			// recovering rather than waiting for a person.
			return "", err
		}
		r.recordError(ctx, "recover sandbox", err)
		if err := r.setStatus(ctx, StatusNeedsReconciliation, "the sandbox could not be brought back to the log's position: "+err.Error()); err != nil {
			return "", err
		}
		return "", nil
	}
	r.recovered = true
	if r.st.Def.Policy == PolicyStrict && r.st.Cut.Checkpoint == "" {
		// The first cut failed before (or the sandbox was made anew
		// without one): no tool runs before it.
		if err := r.firstCut(ctx, r.st.Sandbox); err != nil {
			return "", err
		}
	}
	return r.st.Sandbox, nil
}

// cutOff lists the sandbox tool calls started and not recorded.
func (st *State) cutOff() []string {
	var out []string
	for _, c := range st.Pending {
		if st.ToolAttempts[c.ID] > 0 && changes(c.Name) {
			out = append(out, c.ID)
		}
	}
	return out
}

// recover brings the sandbox to the state the log acknowledges, once per
// Wake, before the first tool runs. Nothing is done when the sandbox runs
// and no sandbox-changing call was cut off (it may have half-changed the
// sandbox). Otherwise the sandbox is restored to the newest step-boundary
// checkpoint (strict: the one the last acknowledged changing step named;
// fast: the newest session.checkpointed) or made anew from the template
// when there is none, and (fast) the recorded changing calls after it are
// re-run in order; a re-run whose output differs from the recorded one is
// a session.divergence event. Then the cut-off call runs again.
func (r *run) recover(ctx context.Context) error {
	st := r.st
	running, err := r.h.Boxes.Running(ctx, st.Tenant, st.Sandbox)
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	cut := st.cutOff()
	if running && len(cut) == 0 {
		return nil
	}
	reason := "the sandbox was lost"
	if running {
		reason = "tool call " + strings.Join(cut, ",") + " was cut off"
	}
	if err := r.setStatus(ctx, StatusRecovering, reason); err != nil {
		return err
	}
	sbx := st.Sandbox
	ev := SandboxRestored{Reason: reason}
	if st.Cut.Checkpoint != "" {
		if err := r.h.Boxes.Restore(ctx, st.Tenant, sbx, st.Cut.Checkpoint); err != nil {
			return fmt.Errorf("restore %s: %w", st.Cut.Checkpoint, err)
		}
		ev.Checkpoint = st.Cut.Checkpoint
	} else {
		// No checkpoint yet: a fresh sandbox replaces the old one.
		if err := r.h.Boxes.Destroy(ctx, st.Tenant, sbx); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if sbx, err = r.newSandbox(ctx); err != nil {
			return err
		}
	}
	ev.Sandbox = sbx
	var rerun []ToolCall
	if st.Def.Policy == PolicyFast {
		for _, id := range st.ChangedAfterCut {
			ev.Rerun = append(ev.Rerun, id)
			rerun = append(rerun, r.findCall(id))
		}
	}
	if _, err := r.appendEvents(ctx, r.event(fmt.Sprintf("restored.%d", st.Head), EventSandboxRestored, ev)); err != nil {
		return err
	}
	if r.h.Meta != nil && sbx != st.Sandbox {
		_ = r.h.Meta.SetSessionSandbox(ctx, r.id, sbx)
	}
	for _, c := range rerun {
		out, isErr, err := runTool(ctx, r.h.Boxes, r.st.Tenant, sbx, c)
		if err != nil {
			return fmt.Errorf("re-run tool call %s: %w", c.ID, err)
		}
		if rec := r.st.Results[c.ID]; rec.Output != out || rec.IsError != isErr {
			if _, err := r.appendEvents(ctx, r.event("divergence."+c.ID+fmt.Sprint(".", r.st.Head), EventDivergence, Divergence{ToolCallID: c.ID, Recorded: rec.Output, Rerun: out})); err != nil {
				return err
			}
		}
	}
	return r.setStatus(ctx, StatusRunning, "")
}

func (r *run) findCall(id string) ToolCall {
	for _, m := range r.st.Messages {
		for _, c := range m.ToolCalls {
			if c.ID == id {
				return c
			}
		}
	}
	return ToolCall{ID: id}
}
