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
// sha256:<digest of the binary>", computed once per binary path.
func (d *Driver) RuntimeBuild(ctx context.Context) (string, error) {
	if b, ok := runtimeBuilds.Load(d.runsc); ok {
		return b.(string), nil
	}
	b, err := binaryBuild("runsc "+PinnedVersion, d.runsc)
	if err != nil {
		return "", err
	}
	runtimeBuilds.Store(d.runsc, b)
	return b, nil
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
