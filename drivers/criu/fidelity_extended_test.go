//go:build extended

package criu

import (
	"testing"

	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// The extended fidelity items for the criu driver (built only with
// -tags extended; `make test-extended` builds their templates first):
//
//	go test -tags seccomp,extended -count=1 -run 'TestFidelity(Browser|Postgres)' -v ./drivers/criu

// TestFidelityBrowser is fidelity item 5 (browser sessions): the live
// browser is checkpointed and restored, no fallback. Chromium runs with
// TZ=UTC, as in the gvisor driver's test; see
// TestFidelityBrowserZoneinfoWatch for why it matters here.
func TestFidelityBrowser(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.Browser(t, td, fidelitytest.LookupTemplate(t, "chromium"),
		fidelitytest.BrowserOptions{ChromiumEnv: []string{"TZ=UTC"}})
}

// TestFidelityBrowserZoneinfoWatch documents a limit of the criu driver
// and proves its fallback. Without TZ, Chromium watches the time zone
// files with inotify (/usr/share/zoneinfo, besides /, /etc and
// /etc/chromium). CRIU 4.1.1 cannot open the watched inodes' overlayfs file
// handles and looks their paths up by irmap, whose hint directories (/etc,
// /var/spool, /lib/udev, ...) do not cover /usr/share/zoneinfo, so the dump
// fails with "fsnotify: Can't dump that handle" whenever that watch is set
// (most runs; it depends on Chromium's start-up). The test allows the
// profile fallback and logs which way it went: live, or profile only
// (cookie and localStorage kept, the page's JavaScript state lost).
func TestFidelityBrowserZoneinfoWatch(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.Browser(t, td, fidelitytest.LookupTemplate(t, "chromium"),
		fidelitytest.BrowserOptions{ProfileFallback: true})
}

// TestFidelityPostgres is fidelity item 6b (database connections and locks).
func TestFidelityPostgres(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	fidelitytest.Postgres(t, td, fidelitytest.LookupTemplate(t, "postgres"))
}
