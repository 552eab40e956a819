package enginetest

import (
	"log/slog"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/criu"
)

func init() {
	initHooks = append(initHooks, criu.InitIfRequested)
	factories["criu"] = func(stateDir string, lg *slog.Logger) (sandbox.Driver, error) {
		return criu.New(criu.Options{StateDir: stateDir, Logger: lg})
	}
}
