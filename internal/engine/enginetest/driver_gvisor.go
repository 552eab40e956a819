package enginetest

import (
	"log/slog"
	"path/filepath"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/gvisor"
	"github.com/amber-run/amber/lib/failpoint"
)

func init() {
	factories["gvisor"] = func(stateDir string, lg *slog.Logger, fps *failpoint.Set) (sandbox.Driver, error) {
		return gvisor.New(gvisor.Options{StateDir: stateDir, RunscPath: filepath.Join(Cache(), "bin", "runsc"), Logger: lg, Failpoints: fps})
	}
}
