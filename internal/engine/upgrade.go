package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/internal/state/templatestore"
)

// Upgrades are the lifecycle's (they checkpoint, create and destroy):
// template management itself is template_ops.go.

// Upgrade moves sandbox r.Sandbox onto another template version: it is
// checkpointed and stopped (the checkpoint is kept, tagged, as the way
// back), a new sandbox is created from the new version with the same
// tenant, limits, env and recovery policy, and the files the old sandbox
// had changed on top of its template (its writable layer, taken from that
// checkpoint: new and modified files with their modes and times; files it
// had deleted are deleted) are copied into the new one. Processes do not
// carry over: the new sandbox boots fresh. sandbox.upgraded is appended to
// both streams.
func (e *Engine) Upgrade(ctx context.Context, r UpgradeRequest) (meta.Sandbox, error) {
	old, err := e.Get(ctx, r.Tenant, r.Sandbox)
	if err != nil {
		return old, err
	}
	t, err := e.tpl.cat.GetContext(ctx, r.Template)
	if err != nil {
		return old, err
	}
	if t.Version == old.TemplateVersion {
		return old, errdefs.FailedPreconditionf("sandbox %s is already on template %s version %s", old.ID, t.Name, templatestore.Short(t.Version))
	}
	if old.State != meta.StateRunning {
		return old, errdefs.FailedPreconditionf("sandbox %s is %s; recover it first (its files are taken from a checkpoint of it running)", old.ID, old.State)
	}
	ck, err := e.Checkpoint(ctx, CheckpointRequest{Tenant: r.Tenant, Sandbox: old.ID, Stop: true,
		Tag: "pre-upgrade-" + templatestore.Short(t.Version), stopReason: "upgraded to template " + t.Name + "@" + templatestore.Short(t.Version)})
	if err != nil {
		return old, fmt.Errorf("upgrade %s: checkpoint: %w", old.ID, err)
	}
	dir := filepath.Join(e.ck.workDir, "upgrade-"+strings.TrimPrefix(newID(), "sbx-"))
	defer os.RemoveAll(dir)
	if _, err := e.ck.store.Restore(ctx, ck.Tenant, ck.ID, dir, chunkstore.RestoreOptions{}); err != nil {
		return old, fmt.Errorf("upgrade %s: fetch checkpoint %s: %w", old.ID, ck.ID, err)
	}
	release, err := e.reserveSandbox(ctx, r.Tenant, old.Limits)
	if err != nil {
		return old, err
	}
	defer release()
	sb, err := e.coldCreate(ctx, t, r.Tenant, old.Limits, old.Env, false, old.Policy, nil)
	if err != nil {
		return old, fmt.Errorf("upgrade %s: create: %w", old.ID, err)
	}
	files, removed, err := e.copyLayer(ctx, sb.ID, filepath.Join(dir, "layer.tar"))
	if err != nil {
		if derr := e.Destroy(context.WithoutCancel(ctx), r.Tenant, sb.ID); derr != nil {
			e.lg.Error("destroy half-upgraded sandbox", "sandbox", sb.ID, "err", derr)
		}
		return old, fmt.Errorf("upgrade %s: copy its files: %w", old.ID, err)
	}
	p := UpgradedPayload{From: old.ID, To: sb.ID, Template: t.Name, FromVersion: old.TemplateVersion, ToVersion: t.Version,
		Checkpoint: ck.ID, Files: files, Removed: removed}
	if err := e.appendEvents(ctx, sb, lifecycleEvent(sb, EventUpgraded, p)); err != nil {
		return sb, err
	}
	if old, err = e.meta.Get(ctx, old.ID); err == nil {
		err = e.appendEvents(ctx, old, lifecycleEvent(old, EventUpgraded, p))
	}
	if err != nil {
		return sb, err
	}
	e.lg.Info("sandbox upgraded", "from", old.ID, "to", sb.ID, "template", t.Name, "version", templatestore.Short(t.Version), "files", files, "removed", removed)
	return sb, nil
}
