package gvisor

import (
	"context"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/drivers/internal/lazyload"
)

// Lazy restore (RestoreOptions.Lazy). `runsc restore --background` starts
// the sandbox once its kernel state and the memory's metadata are read;
// the sentry's loader (pgalloc's async page load) reads the pages file
// behind it, and a task touching a page not yet in waits for that page,
// which the loader fetches ahead of the rest. What the sandbox sees is the
// eager restore's memory, only sooner; the full-memory checks of the
// fidelity tests run on lazily restored sandboxes (TestCheckpointLazy).
//
//   - The image: runsc restore opens the state and pages files and hands
//     their descriptors to the sandbox, so the load reads open files. The
//     engine still keeps the image until Loaded reports (engine/lazy.go);
//     removing it meanwhile would not stop the load.
//   - The end: the sentry's containerManager.WaitRestore returns once every
//     page is in (or the load failed, and the sentry killed the sandbox:
//     its memory is incomplete). watchLoad makes that call and reports
//     through RestoreStats.Loaded; a sandbox that ends before (killed, its
//     control socket gone) reports DataLoss, as criu's driver does.
//   - A cut waits for the end (Checkpoint, bounded by lazyCutWait): the
//     sentry's save would wait for it too, but inside the frozen window.
//
// Images saved compressed cannot load in the background (runsc ignores
// the flag); the driver writes them uncompressed (saveKernel).

// lazyCutWait bounds how long a Checkpoint waits for a lazy restore's
// load.
var lazyCutWait = 2 * time.Minute

// testLazyRestored, when set (tests), is called with the sandbox's id
// once a lazy Restore has started to watch its load (watchLoad; still
// under the id's lock: it must not call the driver).
var testLazyRestored func(id string)

// loadWait bounds the WaitRestore call of one load.
const loadWait = 10 * time.Minute

// watchLoad follows sandbox id's page load to its end and returns
// RestoreStats.Loaded: one value, then closed. Called under id's lock,
// right after a `runsc restore --background` returned.
func (d *Driver) watchLoad(id string) <-chan error {
	pl := lazyload.New()
	d.mu.Lock()
	d.loads[id] = pl
	d.mu.Unlock()
	loaded := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), loadWait)
		defer cancel()
		start := time.Now()
		err := d.control(ctx, id, ctlWaitRestore, nil)
		switch {
		case err == nil:
			d.log.Debug("lazy restore: every page is in", "sandbox", id, "after", time.Since(start).Round(time.Millisecond))
		case controlDown(err):
			err = errdefs.DataLossf("sandbox %s: lazy restore: the sandbox ended before every page was in: %v", id, err)
		default:
			// The sentry killed the sandbox (boot/restore.go postRestore).
			err = errdefs.DataLossf("sandbox %s: lazy restore: loading memory failed, the sandbox was killed: %v", id, err)
		}
		if err != nil {
			d.log.Error("lazy restore did not load every page", "sandbox", id, "err", err)
		}
		d.mu.Lock()
		if d.loads[id] == pl {
			delete(d.loads, id)
		}
		d.mu.Unlock()
		pl.End(err)
		loaded <- err
		close(loaded)
	}()
	if testLazyRestored != nil {
		testLazyRestored(id)
	}
	return loaded
}

// waitLoad waits (up to lazyCutWait, or ctx) until sandbox id's lazy load,
// if one runs, has ended: a cut must not freeze the sandbox before. A load
// that failed fails the cut (the sandbox was killed).
func (d *Driver) waitLoad(ctx context.Context, id string) error {
	d.mu.Lock()
	pl := d.loads[id]
	d.mu.Unlock()
	return pl.WaitForCut(ctx, id, lazyCutWait)
}
