package metadata

import (
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

func TestParseScopes(t *testing.T) {
	if s, err := ParseScopes([]string{"admin", " read", "admin"}); err != nil || len(s) != 2 || s[0] != ScopeRead || s[1] != ScopeAdmin {
		t.Fatalf("parse: %v %v", s, err)
	}
	for _, bad := range [][]string{nil, {""}, {"root"}, {"read", "WRITE"}} {
		if _, err := ParseScopes(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseScopes(%q): %v", bad, err)
		}
	}
}

func TestKeySecret(t *testing.T) {
	s, err := NewKeySecret()
	if err != nil || !strings.HasPrefix(s, "amber_") || len(s) != 6+43 {
		t.Fatalf("secret %q %v", s, err)
	}
	if p := KeyPrefix(s); p != s[:12] || len(HashKey(s)) != 64 || HashKey(s) == HashKey(s+"x") {
		t.Fatalf("prefix %q hash %q", p, HashKey(s))
	}
}
