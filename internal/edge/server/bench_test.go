package server_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestBenchAPIClaim measures POST /v1/sandboxes (through HTTP and the Go
// client) served from a ready warm pool, and an exec round trip
// (`echo`) in the claimed sandbox. Only with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 go test -run TestBenchAPIClaim -v ./internal/edge/server
func TestBenchAPIClaim(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the API claim benchmark")
	}
	const n = 20
	c, env, _ := newAPIWith(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var claim, execRT []time.Duration
	for i := 0; i < n; i++ {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if _, ready := env.Engine.PoolSize("minimal"); ready > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("warm pool never refilled")
			}
		}
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
		claim = append(claim, time.Since(start))
		if err != nil || !sb.FromPool {
			t.Fatalf("claim %d: %v (from pool %t)", i, err, sb.FromPool)
		}
		start = time.Now()
		if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"echo", "hi"}}, nil, nil, nil); err != nil || st.Code != 0 {
			t.Fatalf("exec: %+v %v", st, err)
		}
		execRT = append(execRT, time.Since(start))
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	report := fmt.Sprintf("driver=%s n=%d  API claim p50=%v p99=%v  exec round trip p50=%v p99=%v",
		enginetest.DriverName(), n, pct(claim, 50), pct(claim, 99), pct(execRT, 50), pct(execRT, 99))
	t.Log(report)
	fmt.Println("BENCH", report)
}

func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := max(0, min((p*len(s)+99)/100-1, len(s)-1))
	return s[i].Round(10 * time.Microsecond)
}
