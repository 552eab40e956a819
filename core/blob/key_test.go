package blob_test

import (
	"strings"
	"testing"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/blob/blobtest"
	"github.com/amber-run/amber/core/errdefs"
)

func TestValidateKey(t *testing.T) {
	for _, k := range blobtest.BadKeys {
		if err := blob.ValidateKey(k); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateKey(%q) = %v, want invalid argument", k, err)
		}
	}
	for _, k := range []string{"a", "tenants/acme/chunks/ab/ab12", "x=1/y_2/z-3.4", strings.Repeat("a", 255)} {
		if err := blob.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"", "a", "a/", "a/b", "tenants/acme/chunks/", "a.", "a/b-"} {
		if err := blob.ValidatePrefix(p); err != nil {
			t.Errorf("ValidatePrefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"/", "/a", "a//", "../", "a/../", "a/-", "sp ace", "a/."} {
		if err := blob.ValidatePrefix(p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidatePrefix(%q) = %v, want invalid argument", p, err)
		}
	}
}

func FuzzValidateKey(f *testing.F) {
	for _, k := range append(blobtest.BadKeys, "a/b", "tenants/x/chunks/ab/cd") {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if blob.ValidateKey(key) != nil {
			return
		}
		// A valid key never escapes a directory it is joined to.
		for _, seg := range strings.Split(key, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "\\\x00") {
				t.Fatalf("valid key %q has segment %q", key, seg)
			}
		}
		if strings.HasPrefix(key, "/") || len(key) > blob.MaxKeyLen {
			t.Fatalf("valid key %q", key)
		}
	})
}
