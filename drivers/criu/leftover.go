package criu

import (
	"context"
	"fmt"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/vishvananda/netlink"
)

// thawLeftover thaws sandbox id (ls), found frozen while no lifecycle call
// of this driver holds it — no cut, no kill: a daemon that died between a
// cut's freeze and its thaw (SIGKILL) left it so, and every call into it
// would fail ("paused") for as long as it stays. The cut also deletes the
// sandbox's egress link for the dump (network.go): a sandbox with none is
// plumbed again. It then runs on as after a failed cut. It reports whether
// the sandbox runs now.
func (d *Driver) thawLeftover(id string, ls *liveSandbox) bool {
	l := d.lockOf(id)
	if !l.TryLock() {
		return false // a cut or a kill of this process holds it frozen
	}
	defer l.Unlock()
	return d.thawLeftoverLocked(id, ls)
}

// thawLeftoverLocked is thawLeftover for a caller that holds id's lock
// (Checkpoint: the next cut of a sandbox left frozen was refused as
// "paused" three times and the session waited for a client event — chaos
// seeds 736966, 736971: recovered in 29–31 s).
func (d *Driver) thawLeftoverLocked(id string, ls *liveSandbox) bool {
	if st, err := ls.c.Status(); err != nil || st != libcontainer.Paused {
		return err == nil && st == libcontainer.Running
	}
	if err := ls.c.Resume(); err != nil {
		d.log.Error("a sandbox left frozen by an unfinished cut could not be thawed", "sandbox", id, "err", err)
		return false
	}
	d.log.Warn("sandbox was left frozen by a cut that did not end (the daemon stopped during it); thawed", "sandbox", id)
	if d.opts.Network == nil {
		return true
	}
	s, err := ls.c.State()
	if err != nil {
		d.log.Error("egress link of a thawed sandbox", "sandbox", id, "err", err)
		return true
	}
	pid := s.InitProcessPid
	var links int
	if err := withNetlink(fmt.Sprintf("/proc/%d/ns/net", pid), func(h *netlink.Handle) error {
		links = len(vethsIn(h))
		return nil
	}); err != nil {
		d.log.Error("egress link of a thawed sandbox", "sandbox", id, "err", err)
		return true
	}
	if links == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.plumb(ctx, id, pid); err != nil {
			d.log.Error("egress link of a thawed sandbox; it has no way out", "sandbox", id, "err", err)
		}
	}
	return true
}
