package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"

	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem"
)

// Watchers are WatchDir without a stream (the Python SDK's sync
// watch_dir): CreateWatcher starts a watch whose events GetWatcherEvents
// drains and RemoveWatcher ends. A watcher belongs to the tenant and
// sandbox that made it: another's id is NotFound. It lives in this
// daemon's memory; one nobody asked for in watcherIdle ends by itself.
const (
	maxWatcherEvents = 10000
	maxWatchers      = 64 // per sandbox
)

var watcherIdle = 10 * time.Minute

type watcher struct {
	tenant, id string
	mu         sync.Mutex
	events     []*pb.FilesystemEvent
	overflow   bool
	err        error
	asked      time.Time
	cancel     context.CancelFunc
}

type watchers struct {
	mu   sync.Mutex
	byID map[string]*watcher
}

func newWatchers() *watchers { return &watchers{byID: map[string]*watcher{}} }

func (ws *watchers) lookup(ctx context.Context, wid string) (*watcher, error) {
	c := callOf(ctx)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byID[wid]
	if !ok || w.tenant != c.tenant || w.id != c.id {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no watcher "+wid+" in this sandbox"))
	}
	return w, nil
}

func (ws *watchers) remove(wid string) {
	ws.mu.Lock()
	w := ws.byID[wid]
	delete(ws.byID, wid)
	ws.mu.Unlock()
	if w != nil {
		w.cancel()
	}
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	c := callOf(ctx)
	s.watchers.mu.Lock()
	n := 0
	for _, w := range s.watchers.byID {
		if w.id == c.id {
			n++
		}
	}
	s.watchers.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("this sandbox has 64 watchers already: remove one first"))
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	wid := hex.EncodeToString(b)
	// The watch outlives this call: its context is the watcher's, with
	// the call's values (tenant and sandbox), one of the caller's streams.
	sctx, endStream, err := s.beginStream(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	wctx, cancelWatch := context.WithCancel(sctx)
	cancel := func() { cancelWatch(); endStream() }
	w := &watcher{tenant: c.tenant, id: c.id, asked: time.Now(), cancel: cancel}
	ready := make(chan struct{})
	done := make(chan error, 1)
	m := req.Msg
	go func() {
		done <- s.watch(wctx, m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), ready, func(ev *pb.FilesystemEvent) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.events) >= maxWatcherEvents {
				w.overflow = true
				return nil
			}
			w.events = append(w.events, ev)
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return nil, connectErr(err)
	case <-ctx.Done():
		cancel()
		return nil, connectErr(ctx.Err())
	}
	s.watchers.mu.Lock()
	s.watchers.byID[wid] = w
	s.watchers.mu.Unlock()
	go w.keep(s.watchers, wid, done, cancel)
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: wid}), nil
}

// keep records how the watch ended (done), freeing its stream, and
// removes the watcher once nobody asked for its events in watcherIdle; it
// returns when both happened.
func (w *watcher) keep(ws *watchers, wid string, done <-chan error, cancel func()) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	removed := false
	for done != nil || !removed {
		select {
		case err := <-done:
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			cancel()
			done = nil
		case <-t.C:
			w.mu.Lock()
			idle := time.Since(w.asked) > watcherIdle
			w.mu.Unlock()
			ws.mu.Lock()
			_, there := ws.byID[wid]
			ws.mu.Unlock()
			if idle && there {
				ws.remove(wid)
			}
			removed = idle || !there
		}
	}
}

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := s.watchers.lookup(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked = time.Now()
	if w.overflow {
		w.overflow, w.events = false, nil
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("more than 10000 events since the last call: some were dropped; create the watcher again"))
	}
	if len(w.events) == 0 && w.err != nil && !errors.Is(w.err, context.Canceled) {
		return nil, connectErr(w.err)
	}
	out := &pb.GetWatcherEventsResponse{Events: w.events}
	w.events = nil
	return connect.NewResponse(out), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	if _, err := s.watchers.lookup(ctx, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	s.watchers.remove(req.Msg.GetWatcherId())
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
