package gvisor

import "testing"

// TestParseStats: the restore's one-exec stats — the shell left out of
// the process count, only established TCP lines counted (the header and
// listening sockets are not), and a bad count refused.
func TestParseStats(t *testing.T) {
	out := "5\n" +
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n" +
		"   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2\n" +
		"   0: 00000000000000000000000001000000:1F91 00000000000000000000000001000000:A000 01 00000000:00000000 00:00000000 00000000 0 0 3\n"
	procs, conns, err := parseStats(out)
	if err != nil || procs != 4 || conns != 2 {
		t.Fatalf("parseStats: %d processes, %d connections, %v; want 4, 2", procs, conns, err)
	}
	for _, bad := range []string{"", "x\n", "0\n"} {
		if _, _, err := parseStats(bad); err == nil {
			t.Fatalf("parseStats(%q) accepted", bad)
		}
	}
}
