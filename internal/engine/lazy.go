package engine

// Lazy restore. Where the driver can (Capabilities.LazyRestore: the criu
// driver's `criu lazy-pages`, the gvisor driver's `runsc restore
// --background`), a restore runs the sandbox before every page of its
// memory is in: the driver serves a page on its first fault and loads the
// rest in the background, from the local image the restore was given — the hot copy's hard-linked directory, or the work directory
// the chunk store's image was fetched into. That image must stay until the
// load ends (RestoreStats.Loaded): restoreOnce hands it to awaitLoad,
// which removes the directory and lets the hot copy go (held: neither a
// newer cut of the sandbox nor the tier's size bound removes it meanwhile)
// when the driver reports the end. A load that fails is the driver's to
// end (it kills the sandbox: its memory is incomplete); the engine logs it
// and the crash watch records the sandbox crashed (reconcile.go). A cut
// during the load waits in the driver for its end.

import (
	"log/slog"
	"os"
	"sync"
)

// holdImage returns the release of a restore's image dir (of checkpoint
// ckID; hot: made from its hot copy, which stays held until then): it
// removes dir and lets the copy go. It runs once, whoever calls it.
func (e *checkpointer) holdImage(ckID, dir string, hot bool) func() {
	if hot {
		e.ck.hot.hold(ckID)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = os.RemoveAll(dir)
			if hot {
				e.ck.hot.unhold(ckID)
			}
		})
	}
}

// awaitLoad waits for a lazy restore's load to end (loaded: the driver's
// RestoreStats.Loaded) and then releases its image.
func (e *checkpointer) awaitLoad(lg *slog.Logger, loaded <-chan error, release func()) {
	err := <-loaded
	release()
	if err != nil {
		lg.Error("lazy restore failed after the sandbox ran: the driver killed it", "err", err)
		return
	}
	lg.Debug("lazy restore loaded every page; image released")
}
