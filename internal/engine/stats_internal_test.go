package engine

import (
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

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
	if !isHelper([]string{"df", "-kP", "/"}) || isHelper([]string{"df", "-h"}) || isHelper(nil) {
		t.Fatal("isHelper does not tell Stats' df from others")
	}
}

// TestWithoutHelpers: a process list leaves out Stats' df, and only it.
func TestWithoutHelpers(t *testing.T) {
	ps := []sandbox.Process{{PID: 2, Args: []string{"sleep", "9"}}, {PID: 3, Args: dfArgs}, {PID: 4, Args: []string{"df", "-h"}}}
	got := withoutHelpers(ps)
	if len(got) != 2 || got[0].PID != 2 || got[1].PID != 4 {
		t.Fatalf("withoutHelpers = %+v, want pids 2 and 4", got)
	}
	if len(ps) != 3 || ps[1].PID != 3 {
		t.Fatalf("the driver's list was changed: %+v", ps)
	}
}
