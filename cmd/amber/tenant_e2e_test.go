package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestE2ETenantsAndKeys: the operator makes a tenant and its admin key;
// that key makes a read-only key that expires; each key does what its
// scopes allow and nothing of another tenant; a revoked key is refused.
func TestE2ETenantsAndKeys(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0")

	if got := strings.TrimSpace(d.must("tenant", "create", "acme", "--name", "Acme Corp")); got != "acme" {
		t.Fatalf("tenant create printed %q", got)
	}
	if out := d.must("tenant", "ls"); !strings.Contains(out, "Acme Corp") || !strings.Contains(out, "default") {
		t.Fatalf("tenant ls:\n%s", out)
	}
	adminOut, adminErr, code := d.amber("key", "create", "admin", "--tenant", "acme", "--scope", "read,write,admin")
	acmeAdmin := strings.TrimSpace(adminOut)
	if code != 0 || !strings.HasPrefix(acmeAdmin, "amber_") || !strings.Contains(adminErr, "shown once") {
		t.Fatalf("key create: %d %q %q", code, adminOut, adminErr)
	}
	as := func(token string, args ...string) (string, string, int) {
		return d.amber(append([]string{"--token", token}, args...)...)
	}

	// acme's admin key: its own sandboxes and keys, nobody else's.
	out, errs, code := as(acmeAdmin, "sandbox", "create", "--template", "minimal")
	id := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("acme creates a sandbox: %d %q", code, errs)
	}
	t.Cleanup(func() { as(acmeAdmin, "sandbox", "rm", id) })
	if out := d.must("sandbox", "ls"); strings.Contains(out, id) {
		t.Fatalf("the operator's tenant lists acme's sandbox:\n%s", out)
	}
	if _, errs, code := d.amber("sandbox", "inspect", id); code != 1 || !strings.Contains(errs, "not found") {
		t.Fatalf("the operator's tenant inspects acme's sandbox: %d %q", code, errs)
	}
	// Quotas: the operator's to set; over one, a clear 429.
	if _, errs, code := as(acmeAdmin, "tenant", "quota", "acme", "--max-sandboxes", "9"); code != 1 || !strings.Contains(errs, "operator") {
		t.Fatalf("acme's admin sets its own quota: %d %q", code, errs)
	}
	if out := d.must("tenant", "quota", "acme", "--max-sandboxes", "1"); !strings.Contains(out, "sandboxes         1") && !strings.Contains(out, "sandboxes") {
		t.Fatalf("tenant quota: %q", out)
	}
	if _, errs, code := as(acmeAdmin, "sandbox", "create", "--template", "minimal"); code != 1 || !strings.Contains(errs, "max_sandboxes") {
		t.Fatalf("acme over its sandbox quota: %d %q", code, errs)
	}
	d.must("tenant", "quota", "acme", "--max-sandboxes", "0")
	if _, errs, code := as(acmeAdmin, "tenant", "create", "evil"); code != 1 || !strings.Contains(errs, "operator") {
		t.Fatalf("acme's admin creates a tenant: %d %q", code, errs)
	}
	if _, errs, code := as(acmeAdmin, "key", "ls", "--tenant", "default"); code != 1 || !strings.Contains(errs, "not found") {
		t.Fatalf("acme's admin lists the operator's keys: %d %q", code, errs)
	}

	var ci struct {
		Name, Key, Prefix string
		Scopes            []string
		ExpiresAt         time.Time `json:"expires_at"`
	}
	out, errs, code = as(acmeAdmin, "key", "create", "ci", "--tenant", "acme", "--scope", "read", "--expires", "1h", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &ci) != nil || ci.Key == "" || strings.Join(ci.Scopes, ",") != "read" ||
		ci.ExpiresAt.Before(time.Now().Add(50*time.Minute)) || ci.ExpiresAt.After(time.Now().Add(70*time.Minute)) {
		t.Fatalf("key create --json: %d %q %q", code, out, errs)
	}
	if out, _, code := as(ci.Key, "sandbox", "ls"); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("read key lists: %d %q", code, out)
	}
	if _, errs, code := as(ci.Key, "sandbox", "rm", id); code != 1 || !strings.Contains(errs, "scope write") {
		t.Fatalf("read key removes a sandbox: %d %q", code, errs)
	}
	ls := d.must("key", "ls", "--tenant", "acme")
	if !strings.Contains(ls, "ci") || !strings.Contains(ls, ci.Prefix) || strings.Contains(ls, ci.Key) || strings.Contains(ls, acmeAdmin) {
		t.Fatalf("key ls:\n%s", ls)
	}
	d.must("key", "revoke", "ci", "--tenant", "acme")
	if _, errs, code := as(ci.Key, "sandbox", "ls"); code != 1 || !strings.Contains(errs, "revoked") {
		t.Fatalf("revoked key: %d %q", code, errs)
	}
	if _, errs, code := d.amber("key", "create", "x", "--tenant", "acme", "--expires", "soon"); code != 2 || !strings.Contains(errs, "--expires") {
		t.Fatalf("bad --expires: %d %q", code, errs)
	}
	if _, errs, code := d.amber("key", "ls"); code != 2 || !strings.Contains(errs, "--tenant") {
		t.Fatalf("key ls without --tenant: %d %q", code, errs)
	}
}
