package gvisor

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// RunscFlagsEnv names the environment variable through which the
// sandboxes a driver creates get some of runtimeFlags replaced, e.g.
// AMBER_GVISOR_RUNSC_FLAGS="--file-access=exclusive --overlay2=root:memory".
// It exists to measure runsc's options on real workloads (make
// bench-restore's sqlite stacks, the fidelity suite run with a variant)
// without a rebuild; the defaults stay what the package doc argues for.
// Several of the variants break a promise the doc makes (overlay2 other
// than none hides the layer's writes from Files, the disk limit and the
// layer's checkpoint; exclusive lets the sandbox miss a host-side change),
// so it is an operator's experiment, not a setting. The result is recorded
// per sandbox like the defaults (record.RunscFlags), so a restore uses
// the flags its sandbox was made with.
const RunscFlagsEnv = "AMBER_GVISOR_RUNSC_FLAGS"

// tunableFlags are the runtime flags RunscFlagsEnv may replace: the ones
// that decide speed and that the pinned runsc accepts with a value.
// --network, --host-uds and --host-fifo are isolation, not speed, and stay.
var tunableFlags = []string{"--platform", "--overlay2", "--file-access", "--directfs"}

// sandboxFlags are runtimeFlags with the replacements in spec (RunscFlagsEnv's
// value: flags of the form --name=value, separated by spaces) applied in
// place; a tunable flag that runtimeFlags lacks (--directfs) is appended.
func sandboxFlags(spec string) ([]string, error) {
	flags := slices.Clone(runtimeFlags)
	for _, f := range strings.Fields(spec) {
		name, value, ok := strings.Cut(f, "=")
		if !ok || value == "" || !slices.Contains(tunableFlags, name) {
			return nil, fmt.Errorf("gvisor: %s: %q is not one of %s given as --name=value", RunscFlagsEnv, f, strings.Join(tunableFlags, ", "))
		}
		i := slices.IndexFunc(flags, func(g string) bool { return strings.HasPrefix(g, name+"=") })
		if i < 0 {
			flags = append(flags, f)
		} else {
			flags[i] = f
		}
	}
	// runsc refuses the pair on every call (runsc list included, so a
	// daemon would not even start): say so here, by name.
	if !slices.Contains(flags, "--overlay2=none") && slices.Contains(flags, "--file-access=shared") {
		return nil, fmt.Errorf("gvisor: %s: an --overlay2 other than none needs --file-access=exclusive (runsc: overlay flag is incompatible with shared file access for rootfs)", RunscFlagsEnv)
	}
	return flags, nil
}

// sandboxFlagsFromEnv is sandboxFlags of RunscFlagsEnv's value.
func sandboxFlagsFromEnv() ([]string, error) {
	return sandboxFlags(os.Getenv(RunscFlagsEnv))
}
