package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EUpRetriesStoreErrors: `amber up` on a fresh data dir whose
// metadata store refuses every write and read for its first 1.5 s (a
// chaos db-errors window from the first hit) comes up: its start-up steps
// retry (startRetry) instead of exiting 1. On main the admin key's
// registration met the refused write and `amber up` exited 1 (chaos seed
// 9101, criu: "admin key: put key default/admin: failpoint meta.write:
// injected store error").
func TestE2EUpRetriesStoreErrors(t *testing.T) {
	bin, dir := e2eSetup(t)
	fplog := filepath.Join(dir, "failpoints.log")
	d := startDaemonEnv(t, bin, dir, freeAddr(t), []string{
		"AMBER_TEST_FAILPOINTS=meta.write=1:error/1500ms,meta.read=1:error/1500ms", "AMBER_TEST_FAILPOINT_LOG=" + fplog}, "--pool", "0")
	b, err := os.ReadFile(fplog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "meta.write") {
		t.Fatalf("no meta.write failpoint fired during the start: the test proves nothing\nfailpoint log:\n%s", b)
	}
	if !strings.Contains(d.log(), "start: a step failed; trying it again") {
		t.Fatalf("the daemon came up without retrying a step: the window missed the start\n%s", tail(d.log(), 30))
	}
	// The admin key it registered through the window works.
	d.must("sandbox", "list")
}
