package engine

import "testing"

// A checkpoint is the runtime's business by its runtime part; the agent
// build a driver appends is the driver's (it keeps every build).
func TestRuntimePartLeavesTheAgentToTheDriver(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"runsc 2026 spec 2 agent sha256:aa", "runsc 2026 spec 2 agent sha256:bb"},
		{"runsc 2026 spec 2 agent sha256:aa", "runsc 2026 spec 2"},
		{"criu 4.1.1", "criu 4.1.1"},
	} {
		if runtimePart(c.a) != runtimePart(c.b) {
			t.Errorf("%q and %q: the runtime parts differ", c.a, c.b)
		}
	}
	if runtimePart("runsc A agent sha256:aa") == runtimePart("runsc B agent sha256:aa") {
		t.Error("different runtimes compare equal")
	}
}
