package main

import (
	"bytes"
	"testing"

	"github.com/amber-run/amber/lib/agentproto"
)

func TestRingKeepsTheTailAndCountsOffsets(t *testing.T) {
	r := newRing(10)
	r.write(agentproto.Stdout, []byte("abcdef"))
	r.write(agentproto.Stderr, []byte("ghij"))
	r.write(agentproto.Stdout, []byte("kl"))
	if r.end != 12 || r.start() != 6 {
		t.Fatalf("end %d start %d, want 12 and 6 (the oldest chunk fell out)", r.end, r.start())
	}
	frames, next := r.from(7, 1<<20)
	var got bytes.Buffer
	for _, f := range frames {
		got.Write(f.Data)
	}
	if got.String() != "hijkl" || next != 12 || frames[0].Kind != agentproto.Stderr || frames[0].Offset != 7 {
		t.Fatalf("from 7: %q next %d frames %+v", got.String(), next, frames)
	}
	if fr, n := r.from(12, 1<<20); len(fr) != 0 || n != 12 {
		t.Fatalf("at the end: %v %d", fr, n)
	}
	big := newRing(4)
	big.write(agentproto.Stdout, []byte("0123456789"))
	if fr, _ := big.from(0, 1<<20); len(fr) != 1 || string(fr[0].Data) != "6789" || fr[0].Offset != 6 {
		t.Fatalf("one chunk over the ring: %+v", fr)
	}
}
