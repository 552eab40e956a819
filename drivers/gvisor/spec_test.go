package gvisor

import (
	"slices"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/agentproto"
)

// TestOCISpec checks the spec of every generation: the /tmp bind's source
// is never inside the root; generation 1 has NoNewPrivileges and a
// nosuid,nodev /tmp; generation 0 (sandboxes and checkpoints made before
// it) stays as it was, which runsc restore requires; generation 2 runs the
// agent as root with its token and binds its binary read-only inside /dev;
// rootMountPoints are the spec's mounts in the layer.
func TestOCISpec(t *testing.T) {
	rec := &record{ID: "x", Limits: sandbox.Limits{MemoryBytes: 1 << 30, MilliCPUs: 1000, Pids: 100}}
	const rootfs, src = "/state/sandboxes/x/layer/merged", "/state/sandboxes/x/mnt/tmp"
	tmpOf := func(rec *record) (opts []string, source string) {
		for _, m := range ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent").Mounts {
			if m.Destination == "/tmp" {
				return m.Options, m.Source
			}
		}
		t.Fatal("no /tmp mount")
		return nil, ""
	}
	rec.SpecVersion = 0
	if s := ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent"); s.Process.NoNewPrivileges {
		t.Error("generation 0 has NoNewPrivileges: its checkpoints would not restore")
	}
	if opts, source := tmpOf(rec); !slices.Equal(opts, []string{"rbind", "rw"}) || source != src {
		t.Errorf("generation 0 /tmp: %q from %q", opts, source)
	}
	rec.SpecVersion = 1
	s := ociSpec(rec, rootfs, src, "")
	if !s.Process.NoNewPrivileges {
		t.Error("no NoNewPrivileges")
	}
	if opts, source := tmpOf(rec); !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") || strings.HasPrefix(source, rootfs) {
		t.Errorf("/tmp: %q from %q", opts, source)
	}
	// Generation 2: the agent is the init, as root, with its token; its
	// binary is bound read-only inside /dev's tmpfs from the store.
	rec.SpecVersion, rec.AgentToken, rec.UID, rec.GID = 2, "tok", 1000, 1000
	rec.Env = []string{"PATH=/bin", "A=b"}
	g2 := ociSpec(rec, rootfs, src, "/state/agents/x/amber-agent")
	if !slices.Equal(g2.Process.Args, []string{agentproto.Path}) || g2.Process.User.UID != 0 || g2.Process.User.GID != 0 || !g2.Process.NoNewPrivileges {
		t.Errorf("generation 2 init: %q as %+v", g2.Process.Args, g2.Process.User)
	}
	if !slices.Equal(g2.Process.Env, []string{"PATH=/bin", "A=b", agentproto.TokenEnv + "=tok"}) || len(rec.Env) != 2 {
		t.Errorf("generation 2 init env: %q (record's %q)", g2.Process.Env, rec.Env)
	}
	agentMounts := 0
	for _, m := range g2.Mounts {
		if m.Destination == agentproto.Path {
			agentMounts++
			if m.Source != "/state/agents/x/amber-agent" || m.Type != "bind" || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") {
				t.Errorf("agent mount: %+v", m)
			}
		}
	}
	if agentMounts != 1 || !strings.HasPrefix(agentproto.Path, "/dev/") {
		t.Errorf("%d agent mounts at %s", agentMounts, agentproto.Path)
	}
	for _, m := range s.Mounts {
		if m.Destination == agentproto.Path {
			t.Error("generation 1 binds the agent")
		}
	}
	var top []string
	for _, m := range g2.Mounts { // generation 1's and the agent's
		nested := false
		for _, o := range g2.Mounts {
			if o.Destination != m.Destination && strings.HasPrefix(m.Destination, o.Destination+"/") {
				nested = true
			}
		}
		if !nested {
			top = append(top, m.Destination)
		}
	}
	if !slices.Equal(top, rootMountPoints) {
		t.Errorf("mounts in the layer %q, rootMountPoints %q", top, rootMountPoints)
	}
}
