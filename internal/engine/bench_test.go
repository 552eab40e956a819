package engine_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestBenchClaimVsCold measures Create from a ready warm pool against a cold
// create, on the real driver. It runs only with AMBER_BENCH=1 (N rounds,
// default 30, from AMBER_BENCH_N):
//
//	AMBER_BENCH=1 go test -run TestBenchClaimVsCold -v ./internal/engine
func TestBenchClaimVsCold(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the warm-pool benchmark")
	}
	n := 30
	if v, err := strconv.Atoi(os.Getenv("AMBER_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := env.Engine
	var claim, cold []time.Duration
	for i := 0; i < n; i++ {
		waitPool(t, e, "minimal", 1)
		start := time.Now()
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
		d := time.Since(start)
		if err != nil || !sb.FromPool {
			t.Fatalf("claim %d: %v (from pool %t)", i, err, sb.FromPool)
		}
		claim = append(claim, d)
		if err := e.Destroy(ctx, "default", sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	failed := 0
	for i := 0; i < n; i++ {
		waitPool(t, e, "minimal", 1) // keep the background refill out of the timing
		start := time.Now()
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
		d := time.Since(start)
		if err != nil {
			t.Errorf("cold %d (after %v): %v", i, d, err)
			if failed++; failed > n/10 {
				t.FailNow()
			}
			continue
		}
		cold = append(cold, d)
		if err := e.Destroy(ctx, "default", sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	report := fmt.Sprintf("driver=%s n=%d failed=%d  claim p50=%v p99=%v  cold p50=%v p99=%v",
		enginetest.DriverName(), n, failed, pct(claim, 50), pct(claim, 99), pct(cold, 50), pct(cold, 99))
	t.Log(report)
	fmt.Println("BENCH", report)
	if p := pct(claim, 50); p > 50*time.Millisecond {
		t.Errorf("claim p50 %v is over the 50 ms target", p)
	}
}

// pct returns the p-th percentile (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (p*len(s)+99)/100 - 1
	i = max(0, min(i, len(s)-1))
	return s[i].Round(10 * time.Microsecond)
}
