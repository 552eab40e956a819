package criu

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// unixServerPy listens on a unix socket whose file is in the writable layer
// (/root/srv.sock) and answers every connection with R, drawn at start.
const unixServerPy = `
import os, random, socket
R = "%016x" % random.getrandbits(64)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("/root/srv.sock")
s.listen(8)
print("ready " + R, flush=True)
while True:
    c, _ = s.accept()
    c.sendall((R + "\n").encode())
    c.close()
`

const unixClientPy = `
import socket
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect("/root/srv.sock")
print(c.recv(100).decode().strip())
`

// TestCheckpointUnixSocketFile: a socket file in the writable layer (a
// server's listening unix socket, as PostgreSQL keeps in /tmp) does not
// stop the layer from being archived, and after kill and restore the same
// server (same in-memory R) answers on the same path.
func TestCheckpointUnixSocketFile(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	tmpl := fidelitytest.PythonTemplate(t)
	ctx := context.Background()
	id := newID("unixsk")
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := td.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	srv, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", unixServerPy}})
	if err != nil {
		t.Fatal(err)
	}
	ready, err := waitProcLog(td, id, srv, "ready ", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := strings.TrimPrefix(ready, "ready ")
	if got := strings.TrimSpace(td.sh(id, "python3 -c '"+unixClientPy+"'")); got != r {
		t.Fatalf("before the cut the server answers %q, want %q", got, r)
	}
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, spec, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(td.sh(id, "python3 -c '"+unixClientPy+"'")); got != r {
		t.Errorf("after restore the server at /root/srv.sock answers %q, want %q (the server of before)", got, r)
	}
}
