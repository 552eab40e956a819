package agentproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	in := []Frame{
		{Kind: Stdout, Offset: 0, Data: []byte("hello")},
		{Kind: Stderr, Offset: 5, Data: []byte("err")},
		LostFrame(100, 92),
		{Kind: Rewound, Offset: 7},
		ExitFrame(8, Exit{Code: 137, Signal: "SIGKILL", TimedOut: true}),
	}
	for _, f := range in {
		if err := WriteFrame(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range in {
		got, err := ReadFrame(&b)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Kind != want.Kind || got.Offset != want.Offset || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("frame %d: got %+v, want %+v", i, got, want)
		}
	}
	if _, err := ReadFrame(&b); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
	if e, _ := in[4].Exit(); e.Code != 137 || e.Signal != "SIGKILL" || !e.TimedOut {
		t.Fatalf("exit: %+v", e)
	}
	if in[2].LostBytes() != 92 {
		t.Fatalf("lost: %d", in[2].LostBytes())
	}
}

func TestReadFrameRefusesMalformed(t *testing.T) {
	big := make([]byte, 13)
	big[0] = byte(Stdout)
	big[9], big[10] = 0x7f, 0xff // a length far over MaxFrameData
	for name, b := range map[string][]byte{
		"unknown kind":    {9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"negative offset": {1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"too long":        big,
		"truncated":       {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 'a'},
		"short header":    {1, 0, 0},
		"bad exit":        append([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, "{x"...),
		"exit code range": append([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12}, `{"code":999}`...),
		"lost length":     {5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
	} {
		if _, err := ReadFrame(bytes.NewReader(b)); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
	if err := WriteFrame(io.Discard, Frame{Kind: Stdout, Data: make([]byte, MaxFrameData+1)}); !errors.Is(err, ErrFrame) {
		t.Errorf("writing an oversized frame: %v", err)
	}
}

// FuzzReadFrame: whatever the sandbox sends, the host's decoder returns a
// frame within bounds or an error, and a frame it accepts encodes back to
// the same bytes.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	_ = WriteFrame(&b, Frame{Kind: Stdout, Offset: 3, Data: []byte("abc")})
	f.Add(b.Bytes())
	b.Reset()
	_ = WriteFrame(&b, ExitFrame(9, Exit{Code: 1}))
	f.Add(b.Bytes())
	b.Reset()
	_ = WriteFrame(&b, LostFrame(9, 4))
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				return
			}
			if fr.Offset < 0 || len(fr.Data) > MaxFrameData || fr.Kind < Stdout || fr.Kind > Lost {
				t.Fatalf("accepted out of bounds: %+v", fr)
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, fr); err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			back, err := ReadFrame(&out)
			if err != nil || back.Kind != fr.Kind || back.Offset != fr.Offset || !bytes.Equal(back.Data, fr.Data) {
				t.Fatalf("round trip: %+v vs %+v (%v)", back, fr, err)
			}
		}
	})
}

// CountEstablished counts only state 01 rows, of either table, header
// and short lines left out.
func TestCountEstablished(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:C350 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:C351 0100007F:1F40 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000
   4: 01
`
	if n := CountEstablished(tcp); n != 2 {
		t.Fatalf("CountEstablished = %d, want 2", n)
	}
	if n := CountEstablished(""); n != 0 {
		t.Fatalf("CountEstablished of nothing = %d", n)
	}
}
