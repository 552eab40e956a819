package criu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.RuntimeReporter = (*Driver)(nil)

var runtimeBuilds sync.Map // criu path → build string

// RuntimeBuild implements sandbox.RuntimeReporter: "criu <version>
// sha256:<digest of the binary> agent sha256:<agent build>" (the CRIU
// binary is patched here, so the version alone does not say which build it
// is; the agent build is the binary new sandboxes run as init, which their
// checkpoints name), computed once per path.
func (d *Driver) RuntimeBuild(ctx context.Context) (string, error) {
	b, err := d.criuBuild(ctx)
	if err != nil {
		return "", err
	}
	return b + " agent " + d.agentBuild, nil
}

func (d *Driver) criuBuild(ctx context.Context) (string, error) {
	if b, ok := runtimeBuilds.Load(d.opts.CriuPath); ok {
		return b.(string), nil
	}
	f, err := os.Open(d.opts.CriuPath)
	if err != nil {
		return "", fmt.Errorf("runtime build: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("runtime build: %s: %w", d.opts.CriuPath, err)
	}
	b := "criu " + d.criuVersion(ctx) + " sha256:" + hex.EncodeToString(h.Sum(nil))[:16]
	runtimeBuilds.Store(d.opts.CriuPath, b)
	return b, nil
}
