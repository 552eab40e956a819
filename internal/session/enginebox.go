package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
)

// EngineSandboxes runs a session's tools in the engine's sandboxes.
//
// The sandbox is created with recovery policy "none": the harness cuts the
// session's checkpoints itself, at step boundaries it records in the
// session's log (strict: after every changing step, before its result;
// fast: every FastEvery changing steps), so the engine's own exec-driven
// checkpoints would only duplicate them.
type EngineSandboxes struct{ E *engine.Engine }

// Create implements Sandboxes: the labels are the sandbox's metadata,
// Amber's own (engine.ReservedLabelPrefix), which no tenant can set.
func (b EngineSandboxes) Create(ctx context.Context, tenant, template string, labels map[string]string) (string, error) {
	sb, err := b.E.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: template, Policy: "none", Metadata: labels, ReservedLabels: true})
	return sb.ID, err
}

// Labeled implements Sandboxes: the engine's list by metadata, of this
// node's sandboxes only — on shared stores the engine refuses every call
// for a sandbox another node runs (fenced), so one made there can be
// neither used nor destroyed from here.
func (b EngineSandboxes) Labeled(ctx context.Context, tenant string, labels map[string]string) ([]string, error) {
	sbs, err := b.E.Find(ctx, tenant, engine.ListFilter{Metadata: labels})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, sb := range sbs {
		if sb.Node == b.E.NodeID() {
			ids = append(ids, sb.ID)
		}
	}
	return ids, nil
}

// Running implements Sandboxes: a sandbox stopped for idleness counts as
// running (the engine resumes it at the next call).
func (b EngineSandboxes) Running(ctx context.Context, tenant, id string) (bool, error) {
	sb, err := b.E.Get(ctx, tenant, id)
	if err != nil {
		return false, err
	}
	return sb.State == meta.StateRunning || (sb.State == meta.StateStopped && strings.HasPrefix(sb.Reason, "idle:")), nil
}

// Exec implements Sandboxes.
func (b EngineSandboxes) Exec(ctx context.Context, tenant, id string, r ExecRequest) (ExecResult, error) {
	if r.Detached {
		return b.execDetached(ctx, tenant, id, r)
	}
	var out, errb limitedBuffer
	spec := sandbox.ExecSpec{Args: r.Args, Stdout: &out, Stderr: &errb, Timeout: r.Timeout}
	if r.Stdin != nil {
		spec.Stdin = bytes.NewReader(r.Stdin)
	}
	st, err := b.E.Exec(ctx, tenant, id, spec)
	if err != nil {
		return ExecResult{}, err
	}
	return ExecResult{Stdout: out.Bytes(), Stderr: errb.Bytes(), Code: st.Code, TimedOut: st.TimedOut}, nil
}

// execDetached starts r as a background process of the sandbox, waits for
// it (killing it past r.Timeout) and reads its output from its log.
func (b EngineSandboxes) execDetached(ctx context.Context, tenant, id string, r ExecRequest) (ExecResult, error) {
	pid, err := b.E.StartProcess(ctx, tenant, id, sandbox.ExecSpec{Args: r.Args})
	if err != nil {
		return ExecResult{}, err
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if r.Timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, r.Timeout)
	}
	st, err := b.E.Wait(wctx, tenant, id, pid)
	cancel()
	timedOut := false
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		timedOut = true
		_ = b.E.Signal(ctx, tenant, id, pid, syscall.SIGKILL)
		st, err = b.E.Wait(ctx, tenant, id, pid)
	}
	if err != nil {
		return ExecResult{}, err
	}
	out, err := b.ReadFile(ctx, tenant, id, fmt.Sprintf("/run/amber/proc/%d.log", pid))
	if err != nil && !errdefs.IsNotFound(err) {
		return ExecResult{}, err
	}
	return ExecResult{Stdout: out, Code: st.Code, TimedOut: timedOut}, nil
}

// ReadFile implements Sandboxes.
func (b EngineSandboxes) ReadFile(ctx context.Context, tenant, id, path string) ([]byte, error) {
	fs, err := b.E.Files(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	var buf limitedBuffer
	if err := fs.ReadFile(ctx, path, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteFile implements Sandboxes.
func (b EngineSandboxes) WriteFile(ctx context.Context, tenant, id, path string, data []byte) error {
	fs, err := b.E.Files(ctx, tenant, id)
	if err != nil {
		return err
	}
	return fs.WriteFile(ctx, path, bytes.NewReader(data), 0o644)
}

// Checkpoint implements Sandboxes: a strict cut (engine
// StrictCheckpoint: durable on the node when it returns on local stores,
// uploaded after; uploaded first in a cluster).
func (b EngineSandboxes) Checkpoint(ctx context.Context, tenant, id string) (string, error) {
	ck, err := b.E.StrictCheckpoint(ctx, tenant, id)
	return ck.ID, err
}

// Restore implements Sandboxes.
func (b EngineSandboxes) Restore(ctx context.Context, tenant, id, ckpt string) error {
	ck, err := b.E.GetCheckpoint(ctx, tenant, ckpt)
	if err != nil {
		return err
	}
	if ck.SandboxID != id {
		return errdefs.FailedPreconditionf("checkpoint %s is of sandbox %s, not %s", ckpt, ck.SandboxID, id)
	}
	_, err = b.E.Restore(ctx, engine.RestoreRequest{Tenant: tenant, Checkpoint: ckpt})
	return err
}

// Destroy implements Sandboxes.
func (b EngineSandboxes) Destroy(ctx context.Context, tenant, id string) error {
	return b.E.Destroy(ctx, tenant, id)
}

// limitedBuffer keeps the first 4*maxOutput bytes written to it and
// discards the rest (a tool's output is clipped anyway).
type limitedBuffer struct{ bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4*maxOutput - l.Len(); room > 0 {
		l.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

var _ io.Writer = (*limitedBuffer)(nil)
