package criu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/layer"
)

// recordVersion is the format of sandbox.json. Bump it (and teach
// loadRecord to read the old one) when a field changes meaning.
const recordVersion = 1

// Phases of a record.
const (
	phaseCreating = "creating" // host objects may exist partly; Destroy cleans up
	phaseCreated  = "created"  // the container was started at least once
)

// record is this driver's durable description of one sandbox, in
// <StateDir>/sandboxes/<id>/sandbox.json. Together with libcontainer's
// state.json it is everything needed to find, restore (next issue:
// libcontainer's Restore runs CRIU against the same container and rootfs)
// or destroy the sandbox after a daemon restart.
type record struct {
	Version  int              `json:"version"`
	ID       string           `json:"id"`
	Tenant   string           `json:"tenant,omitempty"`
	Template sandbox.Template `json:"template"`
	// Limits are the effective limits (spec, then template, then defaults).
	Limits sandbox.Limits `json:"limits"`
	Env    []string       `json:"env,omitempty"`
	// Slot is the sandbox's uid range number; HostID the host uid/gid that
	// sandbox id 0 maps to (UIDBase + Slot·65536). Files in the writable
	// layer are owned by host ids HostID..HostID+65535; a checkpoint's
	// layer.tar stores them relative to HostID, so a fork restores it
	// into another slot (fork.go).
	Slot    int       `json:"slot"`
	HostID  int       `json:"host_id"`
	Created time.Time `json:"created"`
	Phase   string    `json:"phase"`
	// Restored holds, for each process a checkpoint restore brought back
	// (by sandbox PID), its start time before the checkpoint: the kernel
	// gives a restored process the restore's start time (see
	// restoredStart).
	Restored map[int]restoredStart `json:"restored,omitempty"`
	// Init is the sandbox's init: initAgent (amber-agent, bound read-only
	// at agentproto.Path; Exec, Start and Signal go through it) or empty:
	// a sandbox created, or restored from a checkpoint made, before the
	// agent, whose init is the sh reaper (reaperScript) and whose
	// commands still run through libcontainer's exec (legacyExec).
	Init string `json:"init,omitempty"`
	// AgentBuild is the agent's build id (agent.Store), which the running
	// agent has mapped and a checkpoint records; AgentToken authorizes
	// the daemon's calls to it (agentproto.TokenHeader). The record is
	// private to root (0600 in a 0700 state directory).
	AgentBuild string `json:"agent_build,omitempty"`
	AgentToken string `json:"agent_token,omitempty"`
}

// initAgent is record.Init of a sandbox whose init is amber-agent.
const initAgent = "agent"

// hasAgent reports whether the sandbox's init is amber-agent.
func (r *record) hasAgent() bool { return r.Init == initAgent }

// restoredStart is the original start time of a restored process. It
// applies only while the process with that PID still has the host start
// time the restore gave it (HostTicks), not to a later process that reuses
// the PID.
type restoredStart struct {
	HostTicks uint64 `json:"host_ticks"`
	Ticks     uint64 `json:"ticks"`
}

// startTicks is the start time (sandbox clock ticks) Processes reports for
// sandbox PID pid whose host start time is hostTicks and whose time
// namespace adds offset.
func (r *record) startTicks(pid int, hostTicks uint64, offset int64) uint64 {
	if rs, ok := r.Restored[pid]; ok && rs.HostTicks == hostTicks {
		return rs.Ticks
	}
	return uint64(int64(hostTicks) + offset)
}

func (d *Driver) recordDir(id string) string  { return filepath.Join(d.sbxDir, id) }
func (d *Driver) recordPath(id string) string { return filepath.Join(d.sbxDir, id, "sandbox.json") }
func (d *Driver) layerDir(id string) string   { return filepath.Join(d.sbxDir, id, "layer") }

// blobCacheDir is sandbox id's layer blob cache (drivers/internal/layer,
// blobs.go): the large files of its upper directory as its last cut saw
// them, which the next cut's image links instead of copying them again.
// It goes with the record directory at Destroy.
func (d *Driver) blobCacheDir(id string) string { return filepath.Join(d.sbxDir, id, "layer-cache") }

func (d *Driver) loadRecord(id string) (*record, error) {
	b, err := os.ReadFile(d.recordPath(id))
	if err != nil {
		if isNotExist(err) {
			return nil, errdefs.NotFoundf("sandbox %s", id)
		}
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, errdefs.DataLossf("sandbox %s: %s: %v", id, d.recordPath(id), err)
	}
	if r.Version != recordVersion {
		return nil, errdefs.DataLossf("sandbox %s: %s has format version %d, this driver reads %d", id, d.recordPath(id), r.Version, recordVersion)
	}
	return &r, nil
}

// saveRecord writes the record atomically: temp file, fsync, rename, fsync
// of the directory.
func (d *Driver) saveRecord(r *record) error {
	dir := d.recordDir(r.ID)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".sandbox.json.*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), d.recordPath(r.ID)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ids lists the sandboxes the driver has any state for: a record directory
// or a libcontainer state directory.
func (d *Driver) ids() ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, dir := range []string{d.sbxDir, d.runc} {
		ents, err := os.ReadDir(dir)
		if err != nil && !isNotExist(err) {
			return nil, err
		}
		for _, e := range ents {
			if !e.IsDir() || validID(e.Name()) != nil || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Uid ranges are claimed with one file per range, <StateDir>/slots/<n>,
// created with O_EXCL and holding the sandbox id: the claim is atomic even
// between two processes over one state directory, so no two sandboxes can
// ever share host ids.

func (d *Driver) slotPath(n int) string {
	return filepath.Join(d.opts.StateDir, "slots", strconv.Itoa(n))
}

// claimSlot claims the lowest free uid range for id.
func (d *Driver) claimSlot(id string) (int, error) {
	for n := 0; n < d.opts.MaxSandboxes; n++ {
		f, err := os.OpenFile(d.slotPath(n), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString(id)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(d.slotPath(n))
			return 0, err
		}
		return n, nil
	}
	return 0, errdefs.ResourceExhaustedf("criu driver: all %d uid ranges in use", d.opts.MaxSandboxes)
}

// releaseSlot gives up id's uid range: slot n when known (>= 0), else any
// claim file naming id (a create that crashed before saving its record).
func (d *Driver) releaseSlot(id string, n int) error {
	owned := func(p string) bool {
		b, err := os.ReadFile(p)
		return err == nil && string(b) == id
	}
	if n >= 0 {
		if p := d.slotPath(n); owned(p) {
			return os.Remove(p)
		}
		return nil
	}
	ents, err := os.ReadDir(filepath.Join(d.opts.StateDir, "slots"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if p := filepath.Join(d.opts.StateDir, "slots", e.Name()); owned(p) {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// effectiveLimits merges spec limits over the template's over the driver's.
func (d *Driver) effectiveLimits(spec, tmpl sandbox.Limits) sandbox.Limits {
	pick := func(vals ...int64) int64 {
		for _, v := range vals {
			if v > 0 {
				return v
			}
		}
		return 0
	}
	o := d.opts.Limits
	return sandbox.Limits{
		MemoryBytes: pick(spec.MemoryBytes, tmpl.MemoryBytes, o.MemoryBytes, DefaultLimits.MemoryBytes),
		MilliCPUs:   pick(spec.MilliCPUs, tmpl.MilliCPUs, o.MilliCPUs, DefaultLimits.MilliCPUs),
		Pids:        pick(spec.Pids, tmpl.Pids, o.Pids, DefaultLimits.Pids),
		DiskBytes:   pick(spec.DiskBytes, tmpl.DiskBytes, o.DiskBytes, DefaultLimits.DiskBytes),
	}
}

func validateLimits(l sandbox.Limits) error {
	if l.MemoryBytes < 8<<20 {
		return errdefs.InvalidArgumentf("memory limit %d bytes: at least 8 MiB", l.MemoryBytes)
	}
	if l.MilliCPUs < 10 {
		return errdefs.InvalidArgumentf("cpu limit %d millicpus: at least 10", l.MilliCPUs)
	}
	if l.DiskBytes < layer.MinDiskBytes {
		return errdefs.InvalidArgumentf("disk limit %d bytes: at least %d MiB", l.DiskBytes, layer.MinDiskBytes>>20)
	}
	if l.Pids < 8 {
		return errdefs.InvalidArgumentf("pids limit %d: at least 8", l.Pids)
	}
	return nil
}

func recordErr(id string, err error) error {
	return fmt.Errorf("sandbox %s: %w", id, err)
}
