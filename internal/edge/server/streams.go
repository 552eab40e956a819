package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// Long-lived streams — followed events, session SSE, exec, process waits,
// terminals — hold a connection, goroutines and often a subscription for
// as long as the client keeps them. Two rules bound them:
//
//   - a tenant holds at most Limits.MaxStreamsPerTenant of them at once on
//     this daemon; one more is a 429 naming the cap (max_streams_per_tenant);
//   - a stream lives only as long as the key that opened it: every
//     keyCheckInterval the keys of the open streams are read again from the
//     store (so a revocation or an expiry on any node counts, not only one
//     made here), and the streams of a key that is gone, revoked or expired
//     are ended: their context is cancelled with errKeyRevoked as its
//     cause, and each handler ends its stream with that error where its
//     format has room for one (an error frame or event) before closing.
//
// A store that cannot be read ends nothing: a database outage must not cut
// every stream; the next check decides.

// keyCheckInterval is how often the keys of open streams are read again.
var keyCheckInterval = 2 * time.Second

// errKeyRevoked is the cause of a stream's end when its key stopped being
// usable.
var errKeyRevoked = fmt.Errorf("the API key of this stream was revoked or expired: %w", errdefs.ErrUnauthenticated)

type openStream struct {
	key    metadata.APIKey
	cancel context.CancelCauseFunc
}

// openStreams counts each tenant's open streams and ends those of keys that
// stopped being usable.
type openStreams struct {
	mu       sync.Mutex
	n        map[string]int // tenant → open streams
	byKey    map[string]map[*openStream]bool
	watching bool
}

// beginStream reserves one of c's tenant's streams and returns the context
// the stream runs in (r's, ended also when c's key stops being usable) and
// the func that ends it; a tenant at its cap gets a 429.
func (s *Server) beginStream(w http.ResponseWriter, r *http.Request, c *call) (context.Context, func(), error) {
	return s.openStreams.begin(s, w.Header(), r.Context(), c.tenant, c.key)
}

// begin is beginStream's work; h, when not nil, gets the Retry-After of
// a refusal.
func (o *openStreams) begin(s *Server, h http.Header, ctx context.Context, tenant string, key metadata.APIKey) (context.Context, func(), error) {
	limit := s.limits.MaxStreamsPerTenant
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n, o.byKey = map[string]int{}, map[string]map[*openStream]bool{}
	}
	if o.n[tenant] >= limit {
		if s.metrics != nil {
			s.metrics.QuotaRejected(tenant, "max_streams_per_tenant")
		}
		if h != nil {
			h.Set("Retry-After", "1")
		}
		return nil, nil, errdefs.ResourceExhaustedf("tenant %s already holds %d open streams (events, sessions, exec, waits, terminals); the limit is %d at once on this daemon (max_streams_per_tenant): close one first", tenant, o.n[tenant], limit)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	st := &openStream{key: key, cancel: cancel}
	o.n[tenant]++
	if o.byKey[key.Hash] == nil {
		o.byKey[key.Hash] = map[*openStream]bool{}
	}
	o.byKey[key.Hash][st] = true
	if !o.watching && key.Hash != "" {
		o.watching = true
		go o.watch(s)
	}
	var once sync.Once
	return sctx, func() {
		once.Do(func() {
			cancel(context.Canceled)
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.n[tenant]--; o.n[tenant] <= 0 {
				delete(o.n, tenant)
			}
			delete(o.byKey[key.Hash], st)
			if len(o.byKey[key.Hash]) == 0 {
				delete(o.byKey, key.Hash)
			}
		})
	}, nil
}

// watch reads the keys of the open streams every keyCheckInterval and ends
// the streams of those no longer usable; it returns when no stream is open
// (the next beginStream starts it again).
func (o *openStreams) watch(s *Server) {
	t := time.NewTicker(keyCheckInterval)
	defer t.Stop()
	for range t.C {
		o.mu.Lock()
		hashes := make([]string, 0, len(o.byKey))
		for h := range o.byKey {
			if h != "" {
				hashes = append(hashes, h)
			}
		}
		if len(hashes) == 0 {
			o.watching = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		for _, h := range hashes {
			ctx, cancel := context.WithTimeout(context.Background(), keyCheckInterval)
			k, err := s.meta.KeyByHash(ctx, h)
			cancel()
			switch {
			case errdefs.IsNotFound(err):
			case err != nil:
				continue // the store decides at the next check
			case k.Usable(s.clock.Now()) == nil:
				continue
			}
			o.mu.Lock()
			n := 0
			for st := range o.byKey[h] {
				st.cancel(errKeyRevoked)
				k, n = st.key, n+1
			}
			o.mu.Unlock()
			if n > 0 {
				s.lg.Info("streams ended: their API key is revoked or expired", "tenant_id", k.Tenant, "key", k.Name, "streams", n)
			}
		}
	}
}

// streamErr is the error a stream whose context ended reports: the key's
// revocation when that was the cause, else err.
func streamErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause == errKeyRevoked {
		return errKeyRevoked
	}
	return err
}

// keyRevoked reports whether ctx ended because its stream's key stopped
// being usable.
func keyRevoked(ctx context.Context) bool { return context.Cause(ctx) == errKeyRevoked }
