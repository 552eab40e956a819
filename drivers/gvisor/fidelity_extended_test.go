//go:build extended

package gvisor

import (
	"testing"

	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// The extended fidelity items for the gvisor driver (built only with
// -tags extended; `make test-extended` builds their templates first):
//
//	go test -tags seccomp,extended -count=1 -run 'TestFidelity(Browser|Postgres)' -v ./drivers/gvisor

// TestFidelityBrowser is fidelity item 5 (browser sessions): the live
// browser is checkpointed and restored, no fallback. Chromium runs with
// TZ=UTC so that the workload is the same as the criu driver's.
func TestFidelityBrowser(t *testing.T) {
	runsc := requireHost(t)
	fidelitytest.Browser(t, newTestDriver(t, runsc, "/amber/gvisor-browser"), fidelitytest.LookupTemplate(t, "chromium"),
		fidelitytest.BrowserOptions{ChromiumEnv: []string{"TZ=UTC"}})
}

// TestFidelityPostgres is fidelity item 6b (database connections and locks).
func TestFidelityPostgres(t *testing.T) {
	runsc := requireHost(t)
	fidelitytest.Postgres(t, newTestDriver(t, runsc, "/amber/gvisor-pg"), fidelitytest.LookupTemplate(t, "postgres"))
}
