package envd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/process"
)

// processService is envd's process.Process on the engine. Every command
// E2B starts is an Amber background process (engine.StartProcess): its
// output is kept in the sandbox by byte offset, so Start streams it from
// offset 0 and Connect re-attaches from offset 0 too (the whole output so
// far, then what follows), after a dropped stream or a daemon restart.
// A Start stream that ends does not end the command, as in envd.
type processService struct{ *service }

// started is what envd knows of a command it started beyond what the
// sandbox's process list says: its config and tag (kept in memory: a
// daemon restart forgets tags, the processes stay listed by their args).
type started struct {
	config *pb.ProcessConfig
	tag    string
	at     time.Time // when envd started it
}

// tags holds each sandbox's started commands by pid and by tag.
type tags struct {
	mu    sync.Mutex
	byPID map[string]map[uint32]started // sandbox → pid → command
	byTag map[string]map[string]uint32  // sandbox → tag → pid
}

func newTags() *tags {
	return &tags{byPID: map[string]map[uint32]started{}, byTag: map[string]map[string]uint32{}}
}

func (t *tags) add(id string, pid uint32, st started) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPID[id] == nil {
		t.byPID[id], t.byTag[id] = map[uint32]started{}, map[string]uint32{}
	}
	t.byPID[id][pid] = st
	if st.tag != "" {
		t.byTag[id][st.tag] = pid
	}
}

// drop forgets pid of sandbox id (it ended).
func (t *tags) drop(id string, pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, ok := t.byPID[id][pid]; ok {
		delete(t.byPID[id], pid)
		if st.tag != "" && t.byTag[id][st.tag] == pid {
			delete(t.byTag[id], st.tag)
		}
	}
	if len(t.byPID[id]) == 0 {
		delete(t.byPID, id)
		delete(t.byTag, id)
	}
}

// prune forgets the commands of sandbox id that are not alive in a list
// read at seen (one started since is not in it).
func (t *tags) prune(id string, alive map[uint32]bool, seen time.Time) {
	t.mu.Lock()
	var gone []uint32
	for pid, st := range t.byPID[id] {
		if !alive[pid] && st.at.Before(seen) {
			gone = append(gone, pid)
		}
	}
	t.mu.Unlock()
	for _, pid := range gone {
		t.drop(id, pid)
	}
}

func (t *tags) count(id string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byPID[id])
}

// maxTracked is how many commands of a sandbox envd keeps the config and
// tag of before it forgets those that ended unseen.
const maxTracked = 1024

func (t *tags) get(id string, pid uint32) (started, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.byPID[id][pid]
	return st, ok
}

// pid resolves a selector: a pid as given, a tag by the commands started
// here.
func (t *tags) pid(id string, sel *pb.ProcessSelector) (int, error) {
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if s.Pid == 0 || s.Pid > 1<<22 {
			return 0, errdefs.InvalidArgumentf("pid %d is not a process id", s.Pid)
		}
		return int(s.Pid), nil
	case *pb.ProcessSelector_Tag:
		t.mu.Lock()
		defer t.mu.Unlock()
		if pid, ok := t.byTag[id][s.Tag]; ok {
			return int(pid), nil
		}
		return 0, errdefs.NotFoundf("sandbox %s: no process tagged %q", id, s.Tag)
	}
	return 0, errdefs.InvalidArgumentf("the process selector names neither a pid nor a tag")
}

// spec checks an E2B process config and makes it an Amber ExecSpec.
func spec(c *pb.ProcessConfig) (sandbox.ExecSpec, error) {
	if c == nil || c.GetCmd() == "" {
		return sandbox.ExecSpec{}, errdefs.InvalidArgumentf("no command given (process.cmd is empty)")
	}
	args := append([]string{c.GetCmd()}, c.GetArgs()...)
	for _, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return sandbox.ExecSpec{}, errdefs.InvalidArgumentf("argument %.40q holds a NUL byte", a)
		}
	}
	env := make([]string, 0, len(c.GetEnvs()))
	for k, v := range c.GetEnvs() {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return sandbox.ExecSpec{}, errdefs.InvalidArgumentf("env %.40q=%.40q is not a NAME=value entry", k, v)
		}
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	cwd := c.GetCwd()
	if c.Cwd != nil {
		p, err := absPath(cwd)
		if err != nil {
			return sandbox.ExecSpec{}, fmt.Errorf("cwd: %w", err)
		}
		cwd = p
	}
	return sandbox.ExecSpec{Args: args, Env: env, Cwd: cwd}, nil
}

// absPath is p checked as an absolute sandbox path, cleaned: relative
// paths are refused (relative to which user's home would be a guess).
func absPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.InvalidArgumentf("path %q holds a NUL byte", p)
	}
	if !strings.HasPrefix(p, "/") {
		return "", errdefs.InvalidArgumentf("path %q is not absolute: sandbox paths start with /", p)
	}
	return path.Clean(p), nil
}

func (s *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], st *connect.ServerStream[pb.StartResponse]) error {
	c := callOf(ctx)
	if req.Msg.Pty != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("pty is not supported by Amber's envd yet: run the command without a pty, or use Amber's terminal API (/v1/sandboxes/{id}/terminal)"))
	}
	sp, err := spec(req.Msg.GetProcess())
	if err != nil {
		return connectErr(err)
	}
	sp.OpenStdin = req.Msg.GetStdin()
	// Every byte reaches the stream (envd's Start loses none): the
	// command waits behind a slow client rather than outrun it.
	sp.Hold = true
	// The stream is admitted before the command starts: a refused one
	// starts nothing.
	ctx, end, err := s.beginStream(ctx)
	if err != nil {
		return err
	}
	defer end()
	tag := req.Msg.GetTag()
	if tag != "" {
		if _, err := s.tags.pid(c.id, &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}); err == nil {
			return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("sandbox %s: a process is tagged %q already", c.id, tag))
		}
	}
	pid, err := s.eng.StartProcess(ctx, c.tenant, c.id, sp)
	if err != nil {
		return connectErr(err)
	}
	if s.tags.count(c.id) >= maxTracked {
		s.prune(ctx, c)
	}
	s.tags.add(c.id, uint32(pid), started{config: req.Msg.GetProcess(), tag: tag, at: time.Now()})
	if t, ok := ctx.Deadline(); ok {
		// The client's timeout (Connect-Timeout-Ms, the SDK's timeoutMs)
		// is the command's, as in envd: it is killed then, whether or not
		// anyone still follows it.
		go s.killAt(c, pid, t)
	}
	send := func(ev *pb.ProcessEvent) error { return st.Send(&pb.StartResponse{Event: ev}) }
	return s.stream(ctx, req.Header(), pid, 0, nil, send)
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], st *connect.ServerStream[pb.ConnectResponse]) error {
	c := callOf(ctx)
	pid, err := s.tags.pid(c.id, req.Msg.GetProcess())
	if err != nil {
		return connectErr(err)
	}
	ctx, end, err := s.beginStream(ctx)
	if err != nil {
		return err
	}
	defer end()
	// What the process wrote so far, read first: an unknown pid is
	// NotFound before the stream's start event.
	var past []sandbox.OutputFrame
	var next int64
	err = s.eng.ProcessOutput(ctx, c.tenant, c.id, pid, 0, false, func(f sandbox.OutputFrame) error {
		past = append(past, f)
		next = f.Offset + int64(len(f.Data))
		return nil
	})
	if err != nil {
		return connectErr(err)
	}
	send := func(ev *pb.ProcessEvent) error { return st.Send(&pb.ConnectResponse{Event: ev}) }
	return s.stream(ctx, req.Header(), pid, next, past, send)
}

// prune forgets the ended commands of the call's sandbox.
func (s *processService) prune(ctx context.Context, c call) {
	seen := time.Now()
	if ps, err := s.eng.Processes(ctx, c.tenant, c.id); err == nil {
		s.tags.prune(c.id, aliveSet(ps), seen)
	}
}

// aliveSet is the pids of ps that are not zombies.
func aliveSet(ps []sandbox.Process) map[uint32]bool {
	alive := make(map[uint32]bool, len(ps))
	for _, p := range ps {
		if p.PID > 0 && p.State != "Z" {
			alive[uint32(p.PID)] = true
		}
	}
	return alive
}

// killAt kills process pid of the call's sandbox at t unless it ended
// before (engine.Wait returned its status).
func (s *processService) killAt(c call, pid int, t time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), t)
	defer cancel()
	if _, err := s.eng.Wait(ctx, c.tenant, c.id, pid); err == nil || ctx.Err() == nil {
		return // it ended (or cannot be waited for: nothing to kill)
	}
	kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer kcancel()
	if err := s.eng.Signal(kctx, c.tenant, c.id, pid, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		s.lg.Warn("envd: cannot kill a command at its timeout", "sandbox_id", c.id, "pid", pid, "err", err)
	}
}

// stream sends a start event for pid, the frames of past, then pid's
// output from offset on as data events until its end event, with a
// keepalive event whenever the stream was quiet for the client's
// interval. ctx is the stream's (beginStream).
func (s *processService) stream(ctx context.Context, h http.Header, pid int, offset int64, past []sandbox.OutputFrame, send func(*pb.ProcessEvent) error) error {
	c := callOf(ctx)
	out := newSender(send)
	defer out.stop()
	if err := out.send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(pid)}}}); err != nil {
		return err
	}
	out.keepalive(ctx, keepalive(h), func() *pb.ProcessEvent {
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}
	})
	ended := false
	fn := func(f sandbox.OutputFrame) error {
		ev := event(f)
		if ev == nil {
			return nil
		}
		if f.Kind == "exited" {
			ended = true
			s.tags.drop(c.id, uint32(pid))
		}
		return out.send(ev)
	}
	for _, f := range past {
		if err := fn(f); err != nil {
			return err
		}
	}
	if ended {
		return nil
	}
	// The client going away ends the stream, never the process.
	return streamEnd(ctx, s.eng.ProcessOutput(ctx, c.tenant, c.id, pid, offset, true, fn))
}

// event is an output frame as an E2B process event (nil: none: a rewound
// or lost frame only moves the offset on).
func event(f sandbox.OutputFrame) *pb.ProcessEvent {
	switch f.Kind {
	case "stdout":
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: f.Data}}}}
	case "stderr":
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: f.Data}}}}
	case "exited":
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(f.Exit)}}
	}
	return nil
}

// endEvent is how envd reports an end (its Go ProcessState's words):
// exited is false for a process a signal ended, whose exit_code is then
// -1; status is "exit status 1" or "signal: killed"; error, set when the
// command did not succeed, is what Go's Wait returned ("exit status 3"),
// with the reason when the sandbox killed it (out of memory).
func endEvent(st *sandbox.ExitStatus) *pb.ProcessEvent_EndEvent {
	if st == nil {
		msg := "the process ended without a status"
		return &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "unknown", Error: &msg}
	}
	ev := &pb.ProcessEvent_EndEvent{ExitCode: int32(st.Code), Exited: st.Signal == "", Status: fmt.Sprintf("exit status %d", st.Code)}
	if st.Signal != "" {
		ev.ExitCode = -1
		ev.Status = "signal: " + signalName(st.Signal)
	}
	if ev.ExitCode != 0 {
		msg := ev.Status
		if st.Reason != "" {
			msg += ": " + st.Reason
		}
		ev.Error = &msg
	}
	return ev
}

// signalName is a signal ("SIGKILL") as Go's syscall.Signal.String
// spells it ("killed"), as envd's status does.
func signalName(s string) string {
	if n := unix.SignalNum(strings.ToUpper(s)); n != 0 {
		return n.String()
	}
	return s
}

func (s *processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	c := callOf(ctx)
	seen := time.Now()
	ps, err := s.eng.Processes(ctx, c.tenant, c.id)
	if err != nil {
		return nil, connectErr(err)
	}
	alive := aliveSet(ps)
	s.tags.prune(c.id, alive, seen)
	out := &pb.ListResponse{}
	for _, p := range ps {
		if !alive[uint32(p.PID)] {
			continue
		}
		info := &pb.ProcessInfo{Pid: uint32(p.PID)}
		if st, ok := s.tags.get(c.id, uint32(p.PID)); ok {
			info.Config = st.config
			if st.tag != "" {
				info.Tag = &st.tag
			}
		} else if p.PPID != 1 || len(p.Args) == 0 {
			// Not a command of the tenant's (the agent's children
			// are; engine.Processes left out the engine's own): one
			// of the sandbox's own, or a command's child.
			continue
		} else {
			info.Config = &pb.ProcessConfig{Cmd: p.Args[0], Args: p.Args[1:]}
		}
		out.Processes = append(out.Processes, info)
	}
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	c := callOf(ctx)
	pid, err := s.tags.pid(c.id, req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	if err := s.input(ctx, pid, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s *processService) input(ctx context.Context, pid int, in *pb.ProcessInput) error {
	c := callOf(ctx)
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		return connectErr(s.eng.WriteStdin(ctx, c.tenant, c.id, pid, bytes.NewReader(v.Stdin), false))
	case *pb.ProcessInput_Pty:
		return connect.NewError(connect.CodeUnimplemented, errors.New("pty input is not supported by Amber's envd yet (no pty commands)"))
	}
	return connect.NewError(connect.CodeInvalidArgument, errors.New("the input holds neither stdin nor pty data"))
}

func (s *processService) StreamInput(ctx context.Context, st *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	c := callOf(ctx)
	pid := 0
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			p, err := s.tags.pid(c.id, ev.Start.GetProcess())
			if err != nil {
				return nil, connectErr(err)
			}
			pid = p
		case *pb.StreamInputRequest_Data:
			if pid == 0 {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the stream's start event named the process"))
			}
			if err := s.input(ctx, pid, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	c := callOf(ctx)
	pid, err := s.tags.pid(c.id, req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	if err := s.eng.WriteStdin(ctx, c.tenant, c.id, pid, bytes.NewReader(nil), true); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	c := callOf(ctx)
	pid, err := s.tags.pid(c.id, req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	if err := s.eng.Signal(ctx, c.tenant, c.id, pid, sig); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	c := callOf(ctx)
	if _, err := s.tags.pid(c.id, req.Msg.GetProcess()); err != nil {
		return nil, connectErr(err)
	}
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("resizing a pty is not supported by Amber's envd yet (it starts no pty commands)"))
}
