package server_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
)

// TestFilesThroughAgent: the files API serves what the sandbox's own
// processes see — a file an exec wrote into the sandbox's tmpfs
// (/dev/shm), which the host's view of the layer does not have — and
// renames (a file, over a file, refusals).
func TestFilesThroughAgent(t *testing.T) {
	c, _, _ := newAPI(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "mkdir -p /dev/shm && echo in-tmpfs > /dev/shm/t"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("exec: %+v %v", st, err)
	}
	var b bytes.Buffer
	if err := c.ReadFile(ctx, sb.ID, "/dev/shm/t", &b); err != nil || b.String() != "in-tmpfs\n" {
		t.Fatalf("read of a file in the sandbox's tmpfs = %q, %v", b.String(), err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/root/a", strings.NewReader("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.ID, "/root/b", strings.NewReader("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, sb.ID, "/root/a", "/root/b"); err != nil {
		t.Fatalf("rename over a file: %v", err)
	}
	b.Reset()
	if err := c.ReadFile(ctx, sb.ID, "/root/b", &b); err != nil || b.String() != "a" {
		t.Fatalf("after the rename /root/b = %q, %v", b.String(), err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/root/a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat of the renamed file's old path = %v", err)
	}
	for _, tc := range []struct {
		from, to string
		kind     error
	}{
		{"/root/a", "/root/c", errdefs.ErrNotFound},
		{"root/b", "/root/c", errdefs.ErrInvalidArgument},
		{"/root/b", "/../../c", errdefs.ErrInvalidArgument},
		{"/root/b", "/", errdefs.ErrInvalidArgument},
	} {
		if err := c.Rename(ctx, sb.ID, tc.from, tc.to); !errors.Is(err, tc.kind) {
			t.Errorf("rename %q → %q = %v, want %v", tc.from, tc.to, err, tc.kind)
		}
	}
}
