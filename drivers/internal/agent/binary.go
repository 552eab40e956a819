package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

// BinaryEnv names the agent binary to use, overriding the search.
const BinaryEnv = "AMBER_AGENT"

// BinaryName is the agent's file name next to the amber binary.
const BinaryName = "amber-agent"

var (
	testBuildOnce sync.Once
	testBuild     string
	testBuildErr  error
)

// FindBinary returns the agent binary this process should put into new
// sandboxes: $AMBER_AGENT, else amber-agent next to the running executable
// (`make build` puts it beside bin/amber). A test binary (go test) with
// neither builds it once from this module's source.
func FindBinary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", errdefs.FailedPreconditionf("$%s: %v", BinaryEnv, err)
		}
		return p, nil
	}
	exe, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(exe), BinaryName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if testing.Testing() {
		testBuildOnce.Do(func() { testBuild, testBuildErr = buildForTests() })
		return testBuild, testBuildErr
	}
	return "", errdefs.FailedPreconditionf("no %s next to %s and no $%s: run `make build`, which builds both", BinaryName, exe, BinaryEnv)
}

// buildForTests builds cmd/amber-agent, static, into a temporary directory.
func buildForTests() (string, error) {
	dir, err := os.MkdirTemp("", "amber-agent-build-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, BinaryName)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/amber-run/amber/cmd/amber-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build amber-agent for the test: %v: %s", err, strings.TrimSpace(string(b)))
	}
	return out, nil
}

// Store keeps agent builds on a node, by digest: <dir>/<hex>/amber-agent,
// read-only, never changed once written. A sandbox runs (and a checkpoint
// names) one build; the store keeps every build so that a restore maps the
// very binary the checkpointed agent had mapped.
type Store struct{ dir string }

// NewStore returns the store in dir (made when missing).
func NewStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Store{dir: dir}, nil
}

// Add copies the binary at src into the store and returns its build id
// ("sha256:<hex>"), the id the agent's Health reports.
func (s *Store) Add(src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	dst := filepath.Join(s.dir, sum, BinaryName)
	if _, err := os.Stat(dst); err == nil {
		return "sha256:" + sum, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return "", err
	}
	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return "sha256:" + sum, nil
}

// Path returns the file of build id, or ErrFailedPrecondition when this
// node does not have it.
func (s *Store) Path(build string) (string, error) {
	sum, ok := strings.CutPrefix(build, "sha256:")
	if !ok || len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
		return "", errdefs.InvalidArgumentf("agent build %q is not sha256:<hex>", build)
	}
	p := filepath.Join(s.dir, sum, BinaryName)
	if _, err := os.Stat(p); err != nil {
		return "", errdefs.FailedPreconditionf("agent build %s is not on this node (%v)", build, err)
	}
	return p, nil
}
