package main

import (
	"strings"
	"testing"
)

// TestE2ELabelsReserved: `amber sandbox create --metadata` with a key of
// Amber's own labels (amber.session, in any case) fails, the daemon's 400
// naming the key, and nothing is made; `sandbox ls --label` by such a key
// is a plain (empty) list: reading is open.
func TestE2ELabelsReserved(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0")
	for _, kv := range []string{"amber.session=ses-1", "Amber.Session.Sandbox=1"} {
		out, errOut, code := d.amber("sandbox", "create", "--template", "minimal", "--metadata", "team=red", "--metadata", kv)
		key, _, _ := strings.Cut(kv, "=")
		if code == 0 || !strings.Contains(errOut, `"`+key+`"`) || !strings.Contains(errOut, "reserved") {
			t.Errorf("sandbox create --metadata %s: exit %d, stdout %q, stderr %q; want a failure naming the key as reserved", kv, code, out, errOut)
		}
	}
	if ls := d.must("sandbox", "ls", "--label", "amber.session=ses-1"); strings.Contains(ls, "sbx-") {
		t.Errorf("sandbox ls --label amber.session=ses-1 lists sandboxes:\n%s", ls)
	}
	if ls := d.must("sandbox", "ls"); strings.Contains(ls, "sbx-") {
		t.Errorf("refused creates made sandboxes:\n%s", ls)
	}
}
