package engine

// What a memory image depends on besides its files: the runtime build that
// wrote it and the CPU features its programs may use. Every checkpoint's
// manifest records both (with the template version, see checkpoint.go), and
// a restore refuses, before fetching anything, an image this node cannot
// honour — instead of running a program that then crashes on an illegal
// instruction or a runtime that misreads its own image.

import (
	"bufio"
	"context"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/meta"
)

// Manifest meta keys (chunkstore.PutOptions.Meta) of a checkpoint.
const (
	metaTemplate        = "template"
	metaTemplateVersion = "template_version"
	metaDriver          = "driver"
	metaRuntimeBuild    = "runtime_build"
	metaCPUFeatures     = "cpu_features"
)

// userCPUFeature selects the x86 /proc/cpuinfo flags that user-space code
// can depend on (instruction set extensions programs and libraries pick at
// startup: glibc's ifuncs, numpy's dispatch, JITs). Kernel-side flags
// (hypervisor, constant_tsc, …) differ between hosts without mattering to a
// restored process and are left out. On arm64 every "Features" entry is a
// user-space hwcap and all are kept.
var userCPUFeature = regexp.MustCompile(`^(mmx|sse.*|ssse3|pni|avx.*|aes|vaes|pclmulqdq|vpclmulqdq|sha_ni|sha512|bmi1|bmi2|fma|fma4|f16c|popcnt|movbe|abm|lzcnt|adx|rdrand|rdseed|xsave.*|erms|fsrm|gfni|amx.*|clflushopt|clwb|cx8|cx16|fxsr|lm|rdpid|rdtscp|pku|ospke|movdiri|movdir64b|serialize|rtm|hle|3dnow.*|tbm|xop|sse4a|cmov|vme|de|pse|tsc|msr|pae|mce|apic|sep|mtrr|pge|mca|pat|pse36|clflush|fpu)$`)

// HostCPUFeatures reads this host's user-visible CPU features from
// /proc/cpuinfo (the first processor's "flags" or "Features"), sorted.
func HostCPUFeatures() ([]string, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "flags":
			var out []string
			for _, fl := range strings.Fields(v) {
				if userCPUFeature.MatchString(fl) {
					out = append(out, fl)
				}
			}
			sort.Strings(out)
			return out, nil
		case "Features":
			out := strings.Fields(v)
			sort.Strings(out)
			return out, nil
		}
	}
	return nil, sc.Err()
}

// runtimeBuild is the driver's exact runtime build ("" if it cannot say).
func (e *checkpointer) runtimeBuild(ctx context.Context) (string, error) {
	rr, ok := e.drv.(sandbox.RuntimeReporter)
	if !ok {
		return "", nil
	}
	return rr.RuntimeBuild(ctx)
}

// hostMeta is what a checkpoint manifest records about this node.
func (e *checkpointer) hostMeta(ctx context.Context, m map[string]string) error {
	rb, err := e.runtimeBuild(ctx)
	if err != nil {
		return err
	}
	m[metaRuntimeBuild] = rb
	feats, err := e.ck.cpuFeatures()
	if err != nil {
		return err
	}
	m[metaCPUFeatures] = strings.Join(feats, " ")
	return nil
}

// checkImageCompat refuses checkpoint ck when its manifest names another
// driver, another runtime build, another template version than its row, or
// CPU features this node lacks. Checkpoints written before these were
// recorded have no runtime build or features; the driver's own checks
// (runsc version, template version) still apply to them.
func (e *checkpointer) checkImageCompat(ctx context.Context, ck meta.Checkpoint, m *chunkstore.Manifest) error {
	mm := m.Meta
	if d := mm[metaDriver]; d != "" && d != e.drv.Name() {
		return errdefs.FailedPreconditionf("checkpoint %s was cut by driver %s; this daemon runs %s", ck.ID, d, e.drv.Name())
	}
	if v := mm[metaTemplateVersion]; v != ck.TemplateVersion {
		return errdefs.DataLossf("checkpoint %s: its manifest names template version %s, its record %s", ck.ID, v, ck.TemplateVersion)
	}
	if want := mm[metaRuntimeBuild]; want != "" {
		have, err := e.runtimeBuild(ctx)
		if err != nil {
			return err
		}
		// The runtime's part must match; the agent build a driver
		// appends (" agent sha256:…") is the driver's to judge: it keeps
		// every agent build a checkpoint names and refuses one it lacks.
		if runtimePart(have) != runtimePart(want) {
			return errdefs.FailedPreconditionf("checkpoint %s was cut by runtime build %q; this node runs %q, and a memory image is only restored by the runtime build that wrote it (restore it on a node with that build)", ck.ID, want, have)
		}
	}
	if rec := strings.Fields(mm[metaCPUFeatures]); len(rec) > 0 {
		have, err := e.ck.cpuFeatures()
		if err != nil {
			return err
		}
		set := map[string]bool{}
		for _, f := range have {
			set[f] = true
		}
		var missing []string
		for _, f := range rec {
			if !set[f] {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			return errdefs.FailedPreconditionf("checkpoint %s was cut on a CPU with features this node lacks: %s; its programs may use them (restore it on a node whose CPU has them)", ck.ID, strings.Join(missing, " "))
		}
	}
	return nil
}

// runtimePart is a runtime build without the agent build the drivers
// append to it (" agent sha256:…").
func runtimePart(build string) string {
	if i := strings.Index(build, " agent "); i >= 0 {
		return build[:i]
	}
	return build
}
