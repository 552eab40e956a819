package engine

import (
	"strings"
	"testing"
)

// FuzzParseDF feeds arbitrary `df -kP` output (the sandbox's df prints it,
// and a tenant can replace df) to parseDF: it never panics, and it returns
// either -1, -1 or two byte counts that are not negative and did not
// overflow (whole KiB).
func FuzzParseDF(f *testing.F) {
	for _, s := range []string{
		"Filesystem           1024-blocks    Used Available Capacity Mounted on\nnone                   1048576     100   1048476   0% /\n",
		"Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/mapper/very-long-name\n 2048 1024 1024 50% /\n",
		"",
		"Filesystem 1024-blocks Used\nnone x y z 0% /\n",
		"h\nfs -5 -7 1 1% /\n",
		"h\nfs 9223372036854775807 9223372036854775807 1 1% /\n",
		"h\nfs 0x10 010 1 1% /\n",
		"\n\n\n" + strings.Repeat("1 ", 50),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		used, total := parseDF(s)
		if used == -1 && total == -1 {
			return
		}
		if used < 0 || total < 0 || used%1024 != 0 || total%1024 != 0 {
			t.Fatalf("parseDF(%q) = %d, %d", s, used, total)
		}
	})
}
