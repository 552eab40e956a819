package gvisor

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

var runtimeBuilds sync.Map // runsc path → build string

// RuntimeBuild implements sandbox.RuntimeReporter: "runsc <module version>
// sha256:<digest of the binary> agent sha256:<digest of amber-agent>" (the
// runsc part computed once per binary path). The agent is part of every
// checkpoint of a sandbox it is the init of: its binary is mapped by the
// checkpointed process, so the image is only known to restore with it.
func (d *Driver) RuntimeBuild(ctx context.Context) (string, error) {
	agentPart := " agent " + d.agentBuild
	if b, ok := runtimeBuilds.Load(d.runsc); ok {
		return b.(string) + agentPart, nil
	}
	b, err := binaryBuild("runsc "+PinnedVersion+" patches "+PatchDigest, d.runsc)
	if err != nil {
		return "", err
	}
	runtimeBuilds.Store(d.runsc, b)
	return b + agentPart, nil
}

func binaryBuild(version, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("runtime build: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("runtime build: %s: %w", path, err)
	}
	return version + " sha256:" + hex.EncodeToString(h.Sum(nil))[:16], nil
}
