package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// Resolution is an operator's finding about an effect that needs
// reconciliation: whether the request reached its destination, and the
// answer a re-run of it gets from then on.
type Resolution struct {
	// Key is the journal key id (Effect.Key in the API).
	Key string
	// Status and Body are the answer recorded as the effect's outcome: what
	// the operator found the destination did (e.g. 200 and the order), or
	// what the agent should be told if it did not happen (e.g. 409).
	Status int
	Body   []byte
	// Note says what the operator found; required (it is the record).
	Note string
}

// Reconcile records r as the outcome of an effect of sandbox that an
// at-most-once request left unknown (intent recorded, no outcome, marked
// effect.needs_reconciliation). From then
// on the effect is done: a re-run of the request is answered from the
// journal with r's status and body, and the upstream is never contacted.
// The outcome is appended under the current run's lease epoch, so the
// sandbox must be running on this node (ErrFailedPrecondition otherwise);
// an effect that has an outcome already is ErrConflict (outcomes are
// written once), an unknown key ErrNotFound.
//
// Durability: the outcome is durable in the log before Reconcile returns;
// the in-memory index follows the log (Journal.append).
func (g *Gateway) Reconcile(ctx context.Context, sandbox string, r Resolution) (Entry, error) {
	j := g.opts.Journal
	if j == nil {
		return Entry{}, errdefs.FailedPreconditionf("the egress journal is off: nothing to reconcile")
	}
	if r.Status < 100 || r.Status > 599 {
		return Entry{}, errdefs.InvalidArgumentf("reconcile %s: status %d is not an HTTP status (100..599)", r.Key, r.Status)
	}
	if strings.TrimSpace(r.Note) == "" {
		return Entry{}, errdefs.InvalidArgumentf("reconcile %s: a note saying what was found is required", r.Key)
	}
	if len(r.Body) > int(g.opts.MaxJournaledBody) {
		return Entry{}, errdefs.InvalidArgumentf("reconcile %s: body of %d bytes exceeds the journal's limit (%d)", r.Key, len(r.Body), g.opts.MaxJournaledBody)
	}
	_, run, ok := g.state(sandbox)
	if !ok || run.ID == "" {
		return Entry{}, errdefs.FailedPreconditionf("sandbox %s has no egress run on this node (is it running?): the journal's lease is its run's", sandbox)
	}
	if err := j.Sync(ctx, sandbox); err != nil {
		return Entry{}, err
	}
	ix, err := j.loaded(ctx, sandbox)
	if err != nil {
		return Entry{}, err
	}
	ix.mu.Lock()
	e, found := ix.entries[r.Key]
	var cur Entry
	if found {
		cur = *e
	}
	ix.mu.Unlock()
	switch {
	case !found || cur.Intent == nil:
		return Entry{}, errdefs.NotFoundf("effect %s of sandbox %s", r.Key, sandbox)
	case cur.Outcome != nil:
		return Entry{}, errdefs.Conflictf("effect %s of sandbox %s has an outcome already (status %d): nothing to reconcile", r.Key, sandbox, cur.Outcome.Status)
	case !cur.NeedsReconciliation:
		// An intent without an outcome that is not marked may still be in
		// flight: its real outcome is on its way and must not be pre-empted.
		return Entry{}, errdefs.FailedPreconditionf("effect %s of sandbox %s does not need reconciliation (in flight?)", r.Key, sandbox)
	}
	sum := sha256.Sum256(r.Body)
	w := Writer{Tenant: run.Tenant, Sandbox: sandbox, Epoch: run.Epoch}
	out := OutcomePayload{Key: r.Key, Run: cur.Intent.Run, Attempt: cur.Attempts, Status: r.Status, Body: r.Body,
		BodySize: int64(len(r.Body)), BodySHA256: hex.EncodeToString(sum[:]), Reconciled: r.Note}
	if err := j.RecordOutcome(ctx, w, out); err != nil {
		return Entry{}, err
	}
	cur.Outcome = &out
	return cur, nil
}
