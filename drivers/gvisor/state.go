package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// recordVersion is the format of sandbox.json. Bump it (and teach
// loadRecord to read the old one) when a field changes meaning.
const recordVersion = 1

// Phases of a record.
const (
	phaseCreating = "creating" // host objects may exist in part; Destroy cleans up
	phaseCreated  = "created"  // runsc started the sandbox at least once
)

// record is this driver's durable description of one sandbox, in
// <StateDir>/sandboxes/<id>/sandbox.json. With the bundle next to it, it is
// everything needed to find the sandbox after a daemon restart, destroy it,
// and (next issue) restore it: `runsc restore --bundle <dir>/bundle` boots
// a checkpoint image with the same config.json, the same rootfs (the
// layer's merged directory), the same network namespace path and the same
// runsc flags.
type record struct {
	Version  int              `json:"version"`
	ID       string           `json:"id"`
	Tenant   string           `json:"tenant,omitempty"`
	Template sandbox.Template `json:"template"`
	// Limits are the effective limits (spec, then template, then defaults).
	Limits sandbox.Limits `json:"limits"`
	// Env is the environment of every process: the template's, then the
	// spec's (later entries win).
	Env []string `json:"env,omitempty"`
	Cwd string   `json:"cwd"`
	UID uint32   `json:"uid"`
	GID uint32   `json:"gid"`
	// RunscFlags are the runtime flags the sandbox was started with.
	RunscFlags []string `json:"runsc_flags"`
	// RunscVersion is the gvisor.dev/gvisor version that started it (a
	// checkpoint image only restores with the same runsc).
	RunscVersion string `json:"runsc_version,omitempty"`
	// SpecVersion is the generation of its OCI spec (see specVersion);
	// absent in records of sandboxes created before generation 1.
	SpecVersion int `json:"spec_version,omitempty"`
	// AgentBuild (generation 2 on) is the build id of the agent binary the
	// sandbox's init runs ("sha256:<hex>", a file of the driver's agent
	// store), and AgentToken the secret every call to that agent carries
	// (see lib/agentproto). The token is why this file is 0600 in a 0700
	// directory: it lets its holder run anything as any user of the
	// sandbox, and nothing outside it.
	AgentBuild string `json:"agent_build,omitempty"`
	AgentToken string `json:"agent_token,omitempty"`
	// Cgroup is the cgroup path (same in every v1 hierarchy).
	Cgroup string `json:"cgroup"`
	// Netns is the bind-mounted network namespace the sandbox runs in.
	Netns   string    `json:"netns"`
	Created time.Time `json:"created"`
	Phase   string    `json:"phase"`
}

func (d *Driver) dir(id string) string        { return filepath.Join(d.sbxDir, id) }
func (d *Driver) recordPath(id string) string { return filepath.Join(d.sbxDir, id, "sandbox.json") }
func (d *Driver) layerDir(id string) string   { return filepath.Join(d.sbxDir, id, "layer") }

// blobCacheDir is sandbox id's layer blob cache (drivers/internal/layer,
// blobs.go): the large files of its upper directory as its last cut saw
// them, which the next cut's image links instead of copying them again.
// A restore removes it: it describes the inodes of the files replaced.
func (d *Driver) blobCacheDir(id string) string { return filepath.Join(d.sbxDir, id, "layer-cache") }
func (d *Driver) bundleDir(id string) string    { return filepath.Join(d.sbxDir, id, "bundle") }
func (d *Driver) execDir(id string) string      { return filepath.Join(d.sbxDir, id, "exec") }
func (d *Driver) netnsPath(id string) string    { return filepath.Join(d.netnsDir, id) }
func (d *Driver) cgroupPath(id string) string   { return filepath.Join(d.opts.CgroupParent, id) }

func (d *Driver) loadRecord(id string) (*record, error) {
	b, err := os.ReadFile(d.recordPath(id))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
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
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(d.recordPath(r.ID), b, 0o600)
}

// writeFileAtomic replaces path with data: temp file in the same directory,
// fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	df, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer df.Close()
	return df.Sync()
}
