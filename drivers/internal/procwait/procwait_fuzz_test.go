package procwait

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary exit-file contents (the sandbox writes them)
// to Parse: it never panics; a status it accepts is 0..255, formats back
// to the same file, and names a signal only above 128; an error names at
// most a bounded prefix of the input.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "0\n", "7\n", "128\n", "137\n", "143\n", "255\n", "7", "7\n8\n", "-1\n", "256\n", "+7\n", "007\n", " 7\n", "7\r\n", "\n", strings.Repeat("9", 100) + "\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, ok, err := Parse(b)
		if err != nil {
			if ok {
				t.Fatalf("Parse(%q): ok with error %v", b, err)
			}
			if n := len(err.Error()); n > 4*maxExitFile+64 {
				t.Fatalf("Parse: error of %d bytes for %d bytes of input", n, len(b))
			}
			return
		}
		if !ok {
			if len(b) != 0 {
				t.Fatalf("Parse(%q): not ok and no error", b)
			}
			return
		}
		if st.Code < 0 || st.Code > 255 {
			t.Fatalf("Parse(%q): code %d", b, st.Code)
		}
		if st.Signal != "" && st.Code <= 128 {
			t.Fatalf("Parse(%q): signal %s for code %d", b, st.Signal, st.Code)
		}
		again, ok2, err2 := Parse([]byte(strconv.Itoa(st.Code) + "\n"))
		if !ok2 || err2 != nil || again != st {
			t.Fatalf("Parse(%q) = %+v; its canonical form parses to %+v %v %v", b, st, again, ok2, err2)
		}
	})
}
