package server

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPCappedCopy: no path of io.Copy fills a capped past its cap. A
// file's WriteTo falls back to the destination's ReadFrom, which an
// embedded bytes.Buffer would offer (and fill whole); a stopping capped
// ends the copy at the cap.
func TestMCPCappedCopy(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, bytes.Repeat([]byte("a"), 3*mcpMaxOutput), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, stop := range []bool{false, true} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		c := &capped{stop: stop}
		n, err := io.Copy(c, f)
		f.Close()
		if c.buf.Len() != mcpMaxOutput || c.dropped == 0 || !strings.HasSuffix(c.String(), "bytes cut]") {
			t.Errorf("stop %v: kept %d, dropped %d", stop, c.buf.Len(), c.dropped)
		}
		if stop && (err == nil || n > mcpMaxOutput) {
			t.Errorf("a stopping capped let the copy go on: %d bytes, %v", n, err)
		}
		if !stop && (err != nil || n != 3*mcpMaxOutput) {
			t.Errorf("a counting capped: %d bytes, %v", n, err)
		}
	}
}
