package failpoint

import (
	"errors"
	"testing"
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
