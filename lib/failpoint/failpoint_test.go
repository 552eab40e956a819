package failpoint

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestArmCountDisarm(t *testing.T) {
	var nilSet *Set
	if nilSet.Eval("x") != nil || nilSet.Hits("x") != 0 {
		t.Fatal("nil set fired")
	}
	s := New()
	s.Arm("p", 2, ErrCrash)
	if err := s.Eval("p"); err != nil {
		t.Fatalf("first hit fired: %v", err)
	}
	if err := s.Eval("p"); !errors.Is(err, ErrCrash) {
		t.Fatalf("second hit: %v, want ErrCrash", err)
	}
	s.Disarm("p")
	if err := s.Eval("p"); err != nil || s.Hits("p") != 3 {
		t.Fatalf("after disarm: %v, hits %d", err, s.Hits("p"))
	}
}

func TestArmFuncFiresOnceWithSubject(t *testing.T) {
	s := New()
	var got []string
	s.ArmFunc("p", 2, func(subject string) error { got = append(got, subject); return nil })
	for _, sub := range []string{"a", "b", "c"} {
		if err := s.EvalFor("p", sub); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || got[0] != "b" || s.Hits("p") != 3 {
		t.Fatalf("fired for %v after %d hits; want once, for b", got, s.Hits("p"))
	}
}

func TestParse(t *testing.T) {
	var fired []string
	acts := map[string]func(point, subject string) error{
		"note": func(p, sub string) error { fired = append(fired, p+"/"+sub); return ErrCrash },
	}
	s, err := Parse("x=1:note, y=2:note", acts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EvalFor("x", "s1"); err != ErrCrash {
		t.Fatalf("x: %v", err)
	}
	s.EvalFor("y", "s1")
	if err := s.EvalFor("y", "s2"); err != ErrCrash {
		t.Fatalf("y: %v", err)
	}
	if len(fired) != 2 || fired[0] != "x/s1" || fired[1] != "y/s2" {
		t.Fatalf("fired %v", fired)
	}
	for _, bad := range []string{"x", "x=0:note", "x=1:nosuch", "=1:note", "x=a:note"} {
		if _, err := Parse(bad, acts); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestParseActionsEachAndWindow(t *testing.T) {
	boom := errors.New("boom")
	var args []string
	s, err := ParseActions("w=2:err/40ms, once=1:err/1ms", func(point, action, arg string) (Action, error) {
		if action != "err" {
			return Action{}, errors.New("unknown")
		}
		args = append(args, point+"/"+arg)
		d, err := time.ParseDuration(arg)
		if err != nil {
			return Action{}, err
		}
		return Action{Fn: Window(d, func(string) error { return boom }), Each: point == "w"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(args) != 2 || args[0] != "w/40ms" {
		t.Fatalf("build got %v", args)
	}
	if err := s.Eval("w"); err != nil {
		t.Fatalf("1st hit fired: %v", err)
	}
	for i := 0; i < 3; i++ { // inside the window: every hit fails
		if err := s.Eval("w"); err != boom {
			t.Fatalf("hit %d in the window: %v", i+2, err)
		}
	}
	time.Sleep(60 * time.Millisecond)
	if err := s.Eval("w"); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	if s.Counts()["w"] != 5 {
		t.Fatalf("counts %v", s.Counts())
	}
	if err := s.Eval("once"); err != boom {
		t.Fatalf("once: %v", err)
	}
	if err := s.Eval("once"); err != nil {
		t.Fatalf("once fired twice (not Each): %v", err)
	}
	for _, bad := range []string{"w=0:err/1s", "w=1:nope", "w=1:err/xyz", "w1:err"} {
		if _, err := ParseActions(bad, func(point, action, arg string) (Action, error) {
			if action != "err" {
				return Action{}, errors.New("unknown action")
			}
			_, err := time.ParseDuration(arg)
			return Action{Fn: func(string) error { return nil }}, err
		}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseActionsSamePointTwice(t *testing.T) {
	var fired []string
	s, err := ParseActions("p=1:a, p=3:b", func(point, action, arg string) (Action, error) {
		return Action{Fn: func(string) error { fired = append(fired, action); return nil }}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		s.Eval("p")
	}
	if strings.Join(fired, ",") != "a,b" {
		t.Fatalf("fired %v, want a at hit 1 and b at hit 3", fired)
	}
}

// TestHang: a Hang armed with ArmCtx blocks the evaluating call until its
// context ends (returning its error) or the release is closed; Eval
// evaluates with no deadline, so only the release ends it there.
func TestHang(t *testing.T) {
	s := New()
	release := make(chan struct{})
	s.ArmCtx("p", 2, true, Hang(release))
	if err := s.EvalCtx(context.Background(), "p", ""); err != nil {
		t.Fatalf("first hit hung or failed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.EvalCtx(ctx, "p", ""); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("a hang with a deadline: %v after %v", err, time.Since(start))
	}
	done := make(chan error, 1)
	go func() { done <- s.Eval("p") }()
	select {
	case err := <-done:
		t.Fatalf("Eval did not hang: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("a released hang: %v", err)
	}
	if n := s.Hits("p"); n != 3 {
		t.Fatalf("hits %d, want 3", n)
	}
}
