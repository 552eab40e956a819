package enginetest

import (
	"log/slog"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/criu"
	"github.com/amber-run/amber/lib/failpoint"
)

func init() {
	initHooks = append(initHooks, criu.InitIfRequested)
	factories["criu"] = func(stateDir string, lg *slog.Logger, fps *failpoint.Set) (sandbox.Driver, error) {
		return criu.New(criu.Options{StateDir: stateDir, Logger: lg, Failpoints: fps})
	}
}
