package server_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
)

// TestBenchExecREST measures the exec round trip of `true` through REST on
// loopback with keep-alive (the Go client's one http.Client), from the
// request to the exit frame, over 200 runs in one sandbox; then 100 execs at
// once into the same sandbox. Only with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 go test -tags seccomp -run TestBenchExecREST -v ./internal/edge/server
//	AMBER_BENCH=1 AMBER_TEST_DRIVER=criu go test -tags seccomp -run TestBenchExecREST -v ./internal/edge/server
func TestBenchExecREST(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the exec benchmark")
	}
	c, env, _ := newAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	run := func() time.Duration {
		start := time.Now()
		st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}}, nil, nil, nil)
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %+v %v", st, err)
		}
		return time.Since(start)
	}
	for i := 0; i < 10; i++ { // warm: the first call dials the agent
		run()
	}
	var rt []time.Duration
	for i := 0; i < 200; i++ {
		rt = append(rt, run())
	}
	const conc = 100
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	start := time.Now()
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"true"}}, nil, nil, nil)
			if err == nil && st.Code != 0 {
				err = fmt.Errorf("exit %d", st.Code)
			}
			errs <- err
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			t.Log(err)
		}
	}
	// The sandbox's own floor, same run: 100 runs of /bin/true from the
	// template's shell inside the sandbox, no round trip to the host.
	var floor []time.Duration
	for i := 0; i < 3; i++ {
		start := time.Now()
		st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done"}}, nil, nil, nil)
		if err != nil || st.Code != 0 {
			t.Fatalf("shell loop: %+v %v", st, err)
		}
		floor = append(floor, time.Since(start)/100)
	}
	report := fmt.Sprintf("driver=%s exec `true` via REST, n=200: p50=%v p90=%v p99=%v; %d concurrent: all done in %v (%.0f/s), %d failed; inside the sandbox /bin/true from sh: %v each (median of 3×100)",
		env.Driver.Name(), pct(rt, 50), pct(rt, 90), pct(rt, 99), conc, took.Round(time.Millisecond), conc/took.Seconds(), failed, pct(floor, 50))
	t.Log(report)
	fmt.Println("BENCH", report)
	if failed > 0 {
		t.Fatalf("%d of %d concurrent execs failed", failed, conc)
	}
}
