package criu

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Checkpoint images. An image directory holds:
//
//	image.json   imageMeta: format version, driver, CRIU version, template,
//	             uid range, limits, env — what Restore needs besides the
//	             template
//	criu/        CRIU's images of the process tree and memory (uncompressed)
//	layer.tar    the writable layer's upper directory (uncompressed PAX tar:
//	             modes, owners relative to the sandbox's uid range, symlinks,
//	             hard links, overlay whiteouts as 0/0 character devices and
//	             every xattr, among them trusted.overlay.opaque):
//	             drivers/internal/layer's archive, walked and extracted by
//	             descriptor
//	layer-blobs/ the bytes of the layer's files of 1 MiB or more, which
//	             layer.tar references: hard links to the sandbox's blob
//	             cache (blobCacheDir), so a file unchanged since the last
//	             cut is not copied again (drivers/internal/layer, blobs.go)
//
// The consistent cut: Checkpoint freezes the sandbox's freezer cgroup
// itself, archives the upper directory, then lets CRIU dump the frozen
// tree (CRIU finds the cgroup frozen and leaves it so), and thaws it last
// (or kills it, LeaveStopped). Memory, processes and files are therefore
// all as of the moment of the freeze.
//
// Restore rebuilds the sandbox from scratch in this driver's state
// directory (a stopped sandbox of that id is destroyed first): a fresh
// layer over the template with layer.tar unpacked into its upper
// directory, the libcontainer container configured as at create, and
// CRIU's restore into it. A restore under the image's own sandbox id goes
// into the uid range the image had (image.json's host_id), which must be
// free on this node and fall on this driver's UIDBase grid or on the old default's
// (base 100000, for images made before the default moved: slotOf). A
// fork — a restore into another sandbox id — gets a free range instead,
// from a private copy of the images with their host ids moved to it
// (fork.go), so it runs beside the original.

// imageFormatVersion 3: CRIU's images hold the network namespace empty
// and image.json says what the driver makes in it (netnsimage.go);
// binaries from before refuse a 3 (their restore would find no namespace
// to make). 2: layer.tar references blobs in layer-blobs/; 1, no blobs,
// which binaries from before blobs read. Both are still restored.
const (
	imageFormatVersion = 3
	imageFormatBlobs   = 2
	imageFormatNoBlobs = 1
	imageMetaName      = "image.json"
	imageCriuDir       = "criu"
	imageLayerName     = "layer.tar"
)

// imageMeta is image.json.
type imageMeta struct {
	Version     int              `json:"version"`
	Driver      string           `json:"driver"`
	CriuVersion string           `json:"criu_version"`
	ID          string           `json:"id"`
	Tenant      string           `json:"tenant,omitempty"`
	Template    sandbox.Template `json:"template"`
	Limits      sandbox.Limits   `json:"limits"`
	Env         []string         `json:"env,omitempty"`
	// HostID is the first host uid/gid of the sandbox's range (IDs long).
	// layer.tar stores owners relative to it.
	HostID  int       `json:"host_id"`
	IDs     int       `json:"ids"`
	Created time.Time `json:"created"`
	Cut     time.Time `json:"cut"`
	// Connections is the number of established TCP connections at the cut.
	Connections int   `json:"connections"`
	LayerFiles  int   `json:"layer_files"`
	MemoryBytes int64 `json:"memory_bytes"`
	// StartTicks are the processes' start times (sandbox clock ticks, as
	// Processes reports them) by sandbox PID. A restored process starts,
	// for the kernel, at the restore; the driver reports these instead
	// (record.Restored).
	StartTicks map[int]uint64 `json:"start_ticks,omitempty"`
	// Init, AgentBuild and AgentToken are the record's: the agent build
	// the restored agent has mapped (a restore binds that very build from
	// the agent store, or fails) and the token it holds in its memory.
	// Empty in images made before the agent (their init is the sh
	// reaper; they restore to the libcontainer exec path).
	Init       string `json:"init,omitempty"`
	AgentBuild string `json:"agent_build,omitempty"`
	AgentToken string `json:"agent_token,omitempty"`
	// Netns is what the sandbox's network namespace held: CRIU dumped it
	// empty and a restore has the driver make it (netnsimage.go). Nil in
	// images whose namespace CRIU dumped (made before imageFormatNetns).
	Netns *netnsImage `json:"netns,omitempty"`
}

// writeImageMeta writes imageDir's image.json (format version) for the
// cut of rec made at cut.
func (d *Driver) writeImageMeta(ctx context.Context, imageDir string, rec *record, cut time.Time, conns, files int, mem int64, starts map[int]uint64, netns *netnsImage) error {
	version := imageFormatVersion
	if netns == nil {
		version = imageFormatBlobs
	}
	meta := imageMeta{
		Version:     version,
		Driver:      "criu",
		CriuVersion: d.criuVersion(ctx),
		ID:          rec.ID,
		Tenant:      rec.Tenant,
		Template:    rec.Template,
		Limits:      rec.Limits,
		Env:         rec.Env,
		HostID:      rec.HostID,
		IDs:         idsPerSandbox,
		Created:     rec.Created,
		Cut:         cut.UTC(),
		Connections: conns,
		LayerFiles:  files,
		MemoryBytes: mem,
		StartTicks:  starts,
		Init:        rec.Init,
		AgentBuild:  rec.AgentBuild,
		AgentToken:  rec.AgentToken,
		Netns:       netns,
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(imageDir, imageMetaName), b, 0o600)
}

// criuVersion is the version of the CRIU binary at Options.CriuPath, run
// once per binary (the link may be moved to a new build meanwhile): each
// cut records it, after its thaw but before a strict call's acknowledgement.
func (d *Driver) criuVersion(ctx context.Context) string {
	bin, err := filepath.EvalSymlinks(d.opts.CriuPath)
	if err != nil {
		bin = d.opts.CriuPath
	}
	d.mu.Lock()
	if d.criuVer.bin == bin && d.criuVer.version != "" {
		defer d.mu.Unlock()
		return d.criuVer.version
	}
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "--version").Output()
	v := criuVersion(string(out))
	d.mu.Lock()
	d.criuVer.bin, d.criuVer.version = bin, v
	d.mu.Unlock()
	return v
}

func readImageMeta(imageDir string) (*imageMeta, error) {
	b, err := os.ReadFile(filepath.Join(imageDir, imageMetaName))
	if err != nil {
		if isNotExist(err) {
			return nil, errdefs.NotFoundf("checkpoint image %s: no %s", imageDir, imageMetaName)
		}
		return nil, err
	}
	var m imageMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errdefs.DataLossf("checkpoint image %s: %s: %v", imageDir, imageMetaName, err)
	}
	if m.Driver != "criu" {
		return nil, errdefs.InvalidArgumentf("checkpoint image %s: made by driver %q, not criu", imageDir, m.Driver)
	}
	if m.Version < imageFormatNoBlobs || m.Version > imageFormatVersion {
		return nil, errdefs.DataLossf("checkpoint image %s: format version %d, this driver reads %d to %d", imageDir, m.Version, imageFormatNoBlobs, imageFormatVersion)
	}
	if (m.Version == imageFormatVersion) != (m.Netns != nil) {
		return nil, errdefs.DataLossf("checkpoint image %s: format version %d with the network namespace's record %v", imageDir, m.Version, m.Netns != nil)
	}
	if m.IDs != idsPerSandbox {
		return nil, errdefs.InvalidArgumentf("checkpoint image %s: uid range of %d ids, this driver uses %d", imageDir, m.IDs, idsPerSandbox)
	}
	return &m, nil
}
