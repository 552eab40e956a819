package engine

import "testing"

func TestParseDF(t *testing.T) {
	for _, c := range []struct {
		in          string
		used, total int64
	}{
		{"Filesystem           1024-blocks    Used Available Capacity Mounted on\nnone                   1048576     100   1048476   0% /\n", 100 << 10, 1 << 30},
		// A long device name wraps onto its own line in some df versions.
		{"Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/mapper/very-long-name\n 2048 1024 1024 50% /\n", 1 << 20, 2 << 20},
		{"", -1, -1},
		{"Filesystem 1024-blocks Used\nnone x y z 0% /\n", -1, -1},
	} {
		u, tot := parseDF(c.in)
		if u != c.used || tot != c.total {
			t.Errorf("parseDF(%q) = %d, %d; want %d, %d", c.in, u, tot, c.used, c.total)
		}
	}
}

// TestIsHelper: the df Stats runs is a helper; a tenant's df is not.
func TestIsHelper(t *testing.T) {
	if !IsHelper([]string{"df", "-kP", "/"}) || IsHelper([]string{"df", "-h"}) || IsHelper(nil) {
		t.Fatal("IsHelper does not tell Stats' df from others")
	}
}
