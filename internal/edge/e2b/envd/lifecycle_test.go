package envd_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/amber-run/amber/internal/edge/e2b/envd"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/process"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// BenchmarkEnvdRun: one E2B command, /bin/true, from Start to its end
// event, over the connect protocol with JSON as the SDK speaks it.
func BenchmarkEnvdRun(b *testing.B) {
	f := newFixtureOf(b, "minimal")
	pc := f.proc(keyA)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}))
		if err != nil {
			b.Fatal(err)
		}
		ended := false
		for s.Receive() {
			if s.Msg().GetEvent().GetEnd() != nil {
				ended = true
			}
		}
		s.Close()
		if !ended {
			b.Fatalf("no end event: %v", s.Err())
		}
	}
}

// TestEnvdAfterDaemonRestart: a background command started through envd
// outlives the daemon: after a restart (a new engine and envd over the
// same state) it is listed, Connect replays its whole output and follows
// it, and it takes input. (Its tag was the old daemon's memory.)
func TestEnvdAfterDaemonRestart(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	pc := f.proc(keyA)
	stdin := true
	sctx, cancel := context.WithCancel(ctx)
	s, err := pc.Start(sctx, connect.NewRequest(&pb.StartRequest{Stdin: &stdin, Process: &pb.ProcessConfig{
		Cmd: "/bin/sh", Args: []string{"-c", `echo before; while read l; do echo "after $l"; done`}}}))
	if err != nil {
		t.Fatal(err)
	}
	c := startCollect(t, s, func(c collected) bool { return c.stdout == "before\n" })
	cancel()
	s.Close()

	f.env.Restart(t)
	ts := httptest.NewServer(envd.Handler(envd.Options{Engine: f.env.Engine, Auth: envd.KeyAuthorizer(f.env.Meta, nil), Logger: enginetest.Logger(t)}))
	t.Cleanup(ts.Close)
	f.url = ts.URL
	pc = f.proc(keyA)

	l, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, p := range l.Msg.Processes {
		listed = listed || p.Pid == c.pid && p.GetConfig().GetCmd() == "/bin/sh"
	}
	if !listed {
		t.Fatalf("pid %d not listed after the restart: %v", c.pid, l.Msg.Processes)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: c.pid}}
	cs, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
		Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("restart\n")}}})); err != nil {
		t.Fatal(err)
	}
	rc := connectCollect(t, cs, func(c collected) bool { return strings.Contains(c.stdout, "after restart\n") })
	if rc.pid != c.pid || rc.stdout != "before\nafter restart\n" {
		t.Fatalf("connect after the restart: %+v", rc)
	}
	if _, err := pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}

// TestEnvdAcrossPauseResume: E2B's pause is a checkpoint that stops the
// sandbox and its resume a restore: a command started through envd is
// the same process after them, re-attached with its whole output, taking
// input.
func TestEnvdAcrossPauseResume(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	pc := f.proc(keyA)
	stdin := true
	tag := "kept"
	sctx, cancel := context.WithCancel(ctx)
	s, err := pc.Start(sctx, connect.NewRequest(&pb.StartRequest{Tag: &tag, Stdin: &stdin, Process: &pb.ProcessConfig{
		Cmd: "/bin/sh", Args: []string{"-c", `echo before; while read l; do echo "after $l"; done`}}}))
	if err != nil {
		t.Fatal(err)
	}
	c := startCollect(t, s, func(c collected) bool { return c.stdout == "before\n" })
	cancel()
	s.Close()

	ck, err := f.env.Engine.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: f.id, Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.env.Engine.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
		t.Fatal(err)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
	cs, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
		Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("resume\n")}}})); err != nil {
		t.Fatal(err)
	}
	rc := connectCollect(t, cs, func(c collected) bool { return strings.Contains(c.stdout, "after resume\n") })
	if rc.pid != c.pid || rc.stdout != "before\nafter resume\n" {
		t.Fatalf("connect after pause and resume: %+v", rc)
	}
}
