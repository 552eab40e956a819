package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestE2EDemo runs `amber demo` as the README's `make demo` does and
// requires its report to hold: the session survives a sandbox SIGKILL and
// a daemon SIGKILL mid-order with its memory, files, processes and
// conversation, and the shop books each order exactly once.
func TestE2EDemo(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	bin, _ := e2eSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "demo")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	report := out.String()
	if err != nil {
		t.Fatalf("amber demo: %v\n%s", err, report)
	}
	for _, want := range []string{"CRASH 1: sandbox", "CRASH 2: daemon SIGKILLed", "shop ledger: [book lamp tea]", "All 9 checks hold."} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "FAIL") {
		t.Errorf("a check failed:\n%s", report)
	}
}
