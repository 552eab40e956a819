package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Journal is the effect journal: intents, outcomes, reconciliation marks and
// divergences of every sandbox, kept in the event log (one stream per
// sandbox, see Stream) so they fail over with it. It keeps an in-memory
// index per sandbox, read from the stream on first use and brought up to
// date by Sync; a Journal is safe for concurrent use.
//
// The journal never sees a secret: callers record headers in the form the
// sandbox sent them (placeholders) and responses after redaction.
type Journal struct {
	store eventlog.Store

	mu  sync.Mutex
	sbs map[string]*index
}

// NewJournal returns a journal over store.
func NewJournal(store eventlog.Store) *Journal {
	return &Journal{store: store, sbs: map[string]*index{}}
}

// Writer is who appends: the sandbox's tenant (the stream's owner), the
// sandbox, and the lease epoch of Stream(Sandbox) the writer holds. An
// append under a stale epoch fails with errdefs.ErrFenced.
type Writer struct {
	Tenant  string
	Sandbox string
	Epoch   uint64
}

// Entry is what the journal knows about one key.
type Entry struct {
	Intent  *IntentPayload // the latest attempt's
	Outcome *OutcomePayload
	// Attempts counts the intents recorded.
	Attempts            int
	NeedsReconciliation bool
	Divergences         int
}

type index struct {
	mu        sync.Mutex
	synced    bool   // read from the store at least once
	next      uint64 // next stream position to read
	entries   map[string]*Entry
	slots     map[string]string     // slot id → key id of the first request recorded there
	reconcile []string              // key ids, in order
	names     map[string]netip.Addr // EventName: name → stand-in address
	// Numbering per run, from the intents: contentID → highest occurrence,
	// run+method+URL → highest slot (see Run.Resume).
	occurrences map[string]int
	slotMax     map[string]int
}

func (j *Journal) index(sandbox string) *index {
	j.mu.Lock()
	defer j.mu.Unlock()
	ix := j.sbs[sandbox]
	if ix == nil {
		ix = &index{next: 1, entries: map[string]*Entry{}, slots: map[string]string{}}
		j.sbs[sandbox] = ix
	}
	return ix
}

// Sync reads the events appended to sandbox's stream since the index last
// saw it. Call it when a writer takes over the stream (a new lease).
func (j *Journal) Sync(ctx context.Context, sandbox string) error {
	ix := j.index(sandbox)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return j.syncLocked(ctx, sandbox, ix)
}

func (j *Journal) syncLocked(ctx context.Context, sandbox string, ix *index) error {
	stream := Stream(sandbox)
	for {
		evs, err := j.store.Read(ctx, stream, ix.next, 1000)
		if errdefs.IsCompacted(err) {
			b, berr := j.store.Bounds(ctx, stream)
			if berr != nil {
				return fmt.Errorf("effect journal %s: %w", stream, berr)
			}
			ix.next = b.First
			continue
		}
		if err != nil {
			return fmt.Errorf("effect journal %s: read from %d: %w", stream, ix.next, err)
		}
		for _, ev := range evs {
			if err := ix.apply(ev); err != nil {
				return err
			}
			ix.next = ev.Seq + 1
		}
		if len(evs) < 1000 {
			ix.synced = true
			return nil
		}
	}
}

func (ix *index) entry(key string) *Entry {
	e := ix.entries[key]
	if e == nil {
		e = &Entry{}
		ix.entries[key] = e
	}
	return e
}

func (ix *index) apply(ev eventlog.Event) error {
	bad := func(err error) error {
		return errdefs.DataLossf("effect journal %s/%d: %s payload: %v", ev.Stream, ev.Seq, ev.Type, err)
	}
	switch ev.Type {
	case EventIntent:
		var p IntentPayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return bad(err)
		}
		e := ix.entry(p.Key)
		e.Intent = &p
		e.Attempts++
		if ix.occurrences == nil {
			ix.occurrences, ix.slotMax = map[string]int{}, map[string]int{}
		}
		cid := contentID(p.Run, p.Method, p.URL, p.BodySHA256)
		ix.occurrences[cid] = max(ix.occurrences[cid], p.Occurrence)
		rs := p.Run + "\x00" + p.Method + " " + p.URL
		ix.slotMax[rs] = max(ix.slotMax[rs], p.Slot)
		sl := slot{Run: p.Run, Method: p.Method, URL: p.URL, Occurrence: p.Slot}.id()
		if _, ok := ix.slots[sl]; !ok {
			ix.slots[sl] = p.Key
		}
	case EventOutcome:
		var p OutcomePayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return bad(err)
		}
		ix.entry(p.Key).Outcome = &p
	case EventReconcile:
		var p ReconcilePayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return bad(err)
		}
		e := ix.entry(p.Key)
		if !e.NeedsReconciliation {
			e.NeedsReconciliation = true
			ix.reconcile = append(ix.reconcile, p.Key)
		}
	case EventName:
		var p NamePayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return bad(err)
		}
		a, err := netip.ParseAddr(p.Addr)
		if err != nil {
			return bad(err)
		}
		if ix.names == nil {
			ix.names = map[string]netip.Addr{}
		}
		if _, ok := ix.names[p.Name]; !ok {
			ix.names[p.Name] = a
		}
	case EventDivergence:
		var p DivergencePayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return bad(err)
		}
		ix.entry(p.Key).Divergences++
	}
	// Other types are not the journal's: skip them.
	return nil
}

// loaded returns sandbox's index, read from the store if this Journal has
// not read it yet.
func (j *Journal) loaded(ctx context.Context, sandbox string) (*index, error) {
	ix := j.index(sandbox)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if !ix.synced {
		if err := j.syncLocked(ctx, sandbox, ix); err != nil {
			return nil, err
		}
	}
	return ix, nil
}

// Lookup returns the entry of k (a copy) and whether the journal has one.
func (j *Journal) Lookup(ctx context.Context, k Key) (Entry, bool, error) {
	ix, err := j.loaded(ctx, k.Sandbox)
	if err != nil {
		return Entry{}, false, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, ok := ix.entries[k.ID()]
	if !ok || (e.Intent == nil && e.Outcome == nil) {
		return Entry{}, false, nil
	}
	return *e, true, nil
}

// lookupSlot returns the key recorded first at s, if any.
func (j *Journal) lookupSlot(ctx context.Context, sandbox string, s slot) (Entry, bool, error) {
	ix, err := j.loaded(ctx, sandbox)
	if err != nil {
		return Entry{}, false, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	k, ok := ix.slots[s.id()]
	if !ok {
		return Entry{}, false, nil
	}
	return *ix.entries[k], true, nil
}

// Reconciliations returns the entries of sandbox marked as needing
// reconciliation, in the order they were marked.
func (j *Journal) Reconciliations(ctx context.Context, sandbox string) ([]Entry, error) {
	ix, err := j.loaded(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]Entry, 0, len(ix.reconcile))
	for _, k := range ix.reconcile {
		out = append(out, *ix.entries[k])
	}
	return out, nil
}

// RecordIntent durably records the intent of attempt p.Attempt of p.Key.
// It returns only once the intent is in the log: the caller forwards
// after, never before. errdefs.ErrFenced means the writer lost the stream.
func (j *Journal) RecordIntent(ctx context.Context, w Writer, p IntentPayload) error {
	return j.append(ctx, w, EventIntent, p.Key, ".i"+strconv.Itoa(p.Attempt), p)
}

// RecordOutcome durably records the outcome of p.Key.
func (j *Journal) RecordOutcome(ctx context.Context, w Writer, p OutcomePayload) error {
	return j.append(ctx, w, EventOutcome, p.Key, ".o", p)
}

// RecordReconcile marks p.Key as needing reconciliation (idempotent).
func (j *Journal) RecordReconcile(ctx context.Context, w Writer, p ReconcilePayload) error {
	return j.append(ctx, w, EventReconcile, p.Key, ".r", p)
}

// RecordDivergence records a divergence of p.Key (idempotent per key).
func (j *Journal) RecordDivergence(ctx context.Context, w Writer, p DivergencePayload) error {
	return j.append(ctx, w, EventDivergence, p.Key, ".d", p)
}

// RecordName records that sandbox's DNS answered name with addr and returns
// the address recorded for name, which is an earlier one if there was one.
// A name that is not a host name's shape (checkName: at most 253 bytes,
// labels of at most 63) is refused and nothing is appended.
func (j *Journal) RecordName(ctx context.Context, w Writer, name string, addr netip.Addr) (netip.Addr, error) {
	if err := checkName(name); err != nil {
		return netip.Addr{}, fmt.Errorf("effect journal %s: record name: %w", Stream(w.Sandbox), err)
	}
	if err := j.append(ctx, w, EventName, "dns:"+name, ".n", NamePayload{Name: name, Addr: addr.String()}); err != nil {
		return netip.Addr{}, err
	}
	names, err := j.Names(ctx, w.Sandbox)
	if err != nil {
		return netip.Addr{}, err
	}
	a, ok := names[name]
	if !ok {
		return netip.Addr{}, errdefs.DataLossf("effect journal %s: name %s recorded but not found", Stream(w.Sandbox), name)
	}
	return a, nil
}

// numbering returns how far run of sandbox numbered its requests: the
// highest occurrence per content id and the highest slot per method+URL.
func (j *Journal) numbering(ctx context.Context, sandbox, run string) (counts, slots map[string]int, err error) {
	ix, err := j.loaded(ctx, sandbox)
	if err != nil {
		return nil, nil, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	counts, slots = map[string]int{}, map[string]int{}
	for cid, n := range ix.occurrences {
		counts[cid] = n // content ids include the run: others never match
	}
	prefix := run + "\x00"
	for rs, n := range ix.slotMax {
		if rest, ok := strings.CutPrefix(rs, prefix); ok {
			slots[rest] = n
		}
	}
	return counts, slots, nil
}

// Names returns the stand-in addresses recorded for sandbox's names.
func (j *Journal) Names(ctx context.Context, sandbox string) (map[string]netip.Addr, error) {
	ix, err := j.loaded(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make(map[string]netip.Addr, len(ix.names))
	for n, a := range ix.names {
		out[n] = a
	}
	return out, nil
}

// append writes one event whose id is derived from the sandbox, the key and
// suffix, so a retried append (its answer lost) is a no-op.
func (j *Journal) append(ctx context.Context, w Writer, typ, key, suffix string, payload any) error {
	body, err := json.Marshal(payload)
	if err != nil {
		return errdefs.InvalidArgumentf("effect %s: encode %s: %v", key, typ, err)
	}
	ev := eventlog.Event{
		Tenant:  w.Tenant,
		ID:      "fx-" + digestFields(w.Sandbox, key)[:40] + suffix,
		Type:    typ,
		Version: 1,
		Payload: body,
	}
	ix, err := j.loaded(ctx, w.Sandbox)
	if err != nil {
		return err
	}
	stream := Stream(w.Sandbox)
	res, err := j.store.Append(ctx, stream, w.Epoch, eventlog.Any, ev)
	if err != nil {
		return fmt.Errorf("effect journal %s: append %s: %w", stream, typ, err)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if res.First == ix.next {
		ev.Seq, ev.Stream = res.First, stream
		if err := ix.apply(ev); err != nil {
			return err
		}
		ix.next = res.Last + 1
		return nil
	}
	// Someone else appended in between (or this was a duplicate): read.
	return j.syncLocked(ctx, w.Sandbox, ix)
}
