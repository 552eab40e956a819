package gvisor

import (
	"slices"
	"testing"
)

// TestSandboxFlags: RunscFlagsEnv replaces a tunable flag in place, appends
// one the defaults lack, leaves the isolation flags alone and refuses
// anything else (a typo must not silently run the defaults).
func TestSandboxFlags(t *testing.T) {
	got, err := sandboxFlags("")
	if err != nil || !slices.Equal(got, runtimeFlags) {
		t.Fatalf("empty: %q, %v; want the defaults %q", got, err, runtimeFlags)
	}
	got, err = sandboxFlags(" --file-access=exclusive  --overlay2=root:memory --directfs=false ")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--platform=systrap", "--network=sandbox", "--overlay2=root:memory", "--file-access=exclusive", "--host-uds=none", "--host-fifo=none", "--directfs=false"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if runtimeFlags[2] != "--overlay2=none" {
		t.Fatalf("sandboxFlags changed runtimeFlags: %q", runtimeFlags)
	}
	for _, bad := range []string{"--network=host", "--host-uds=all", "--overlay2", "--overlay2=", "overlay2=none", "--platform ptrace", "--overlay2=root:memory"} {
		if _, err := sandboxFlags(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}
