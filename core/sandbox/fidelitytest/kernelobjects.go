package fidelitytest

import (
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// kernelObjectsPy holds one kind of kernel object (its argument, the part)
// that lives only in the kernel (and so only in a checkpoint's image), with
// values drawn at random inside the sandbox, then, once /tmp/ko.go appears,
// checks it and prints one "part: ok" or "part: <what it found>" line:
//
//   - zombie: a child that exited with a random status, not yet waited for:
//     it must still be a zombie (state Z) and waitpid must give its status;
//   - fifo: a FIFO opened read-write, its path then unlinked, a random token
//     written into its buffer: the token must still be readable from the fd;
//   - unixsock: a listening and a datagram unix socket whose paths were
//     unlinked (nothing can reach them, so the check is the sockets' own):
//     getsockname names each path, and a non-blocking accept or recv says
//     "nothing pending" (EAGAIN), not an error of the socket;
//   - tcpfull: loopback TCP connections whose senders filled the send
//     buffer (the receiver never read), one sender blocked in send(2)
//     through the cut: each receiver must read exactly the bytes its
//     sender wrote;
//   - locks: POSIX (fcntl), flock and OFD locks on files in the writable
//     layer (/root) and in /tmp: after the restore another process is
//     refused each, and the holder still owns each (it converts it to
//     shared and back and lets go; then another process gets it).
const kernelObjectsPy = `
import os, socket, sys, time, errno, random, fcntl, stat

def line(s):
    sys.stdout.write(s + "\n"); sys.stdout.flush()

part = sys.argv[1]
child = status = sent = 0
token = tail = b""
if part == "zombie":
  status = random.randint(3, 120)
  child = os.fork()
  if child == 0:
    os._exit(status)
  while open("/proc/%d/stat" % child).read().split(") ")[1][0] != "Z":
    time.sleep(0.01)

if part == "fifo":
  token = ("%016x" % random.getrandbits(64)).encode()
  os.mkfifo("/tmp/ko.fifo")
  ffd = os.open("/tmp/ko.fifo", os.O_RDWR | os.O_NONBLOCK)
  os.unlink("/tmp/ko.fifo")
  os.write(ffd, token)

if part == "unixsock":
  us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  us.bind("/tmp/ko.sock"); us.listen(4); us.setblocking(False)
  os.unlink("/tmp/ko.sock")
  ud = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
  ud.bind("/tmp/ko.dgram"); ud.setblocking(False)
  os.unlink("/tmp/ko.dgram")

if part == "locks":
  import fcntl, struct
  def ofd(fd, kind):
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhxxxxqqixxxx", kind, 0, 0, 0, 0))
  # In the writable layer and in /tmp (a mount of its own under gvisor).
  kinds = [(d, k) for d in ("/root", "/tmp") for k in ("posix", "flock", "ofd")]
  lk = {}
  for d, k in kinds:
    fd = lk[d, k] = os.open(d + "/ko.lock." + k, os.O_RDWR | os.O_CREAT, 0o600)
    if k == "posix": fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    elif k == "flock": fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else: ofd(fd, fcntl.F_WRLCK)
  def held():  # a child, another owner, tries each lock
    pid = os.fork()
    if pid == 0:
      bits = 0
      for i, (d, name) in enumerate(kinds):
        fd = os.open(d + "/ko.lock." + name, os.O_RDWR)
        try:
          if name == "posix": fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          elif name == "flock": fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          else: ofd(fd, fcntl.F_WRLCK)
        except OSError:
          bits |= 1 << i  # refused: the lock is held
      os._exit(bits)
    return os.WEXITSTATUS(os.waitpid(pid, 0)[1])
  if held() != 63:
    line("locks: not all held before the cut: %d" % held()); sys.exit(1)

if part == "tcpfull":
  ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
  tx = socket.create_connection(ls.getsockname()); rx, _ = ls.accept()
  tx.setblocking(False)
  while True:
    try:
      sent += tx.send(b"x" * 65536)
    except BlockingIOError:
      break
  # A second sender blocks in send(2) on a full buffer through the cut.
  import threading
  ls2 = socket.socket(); ls2.bind(("127.0.0.1", 0)); ls2.listen(1)
  tx2 = socket.create_connection(ls2.getsockname()); rx2, _ = ls2.accept()
  blocked, stop = [0], threading.Event()
  def pump():
    while not stop.is_set():
      blocked[0] += tx2.send(b"y" * 65536)
    tx2.shutdown(socket.SHUT_WR)
  pumper = threading.Thread(target=pump, daemon=True)
  pumper.start()
  time.sleep(0.5)

line("ready %s %d %d %s %d" % (part, child, status, token.decode(), sent))
while not os.path.exists("/tmp/ko.go"):
    time.sleep(0.05)

if part == "zombie":
  try:
    st = open("/proc/%d/stat" % child).read().split(") ")[1][0]
    pid, ws = os.waitpid(child, os.WNOHANG)
    if st != "Z": line("zombie: state %s, not Z" % st)
    elif pid != child or not os.WIFEXITED(ws) or os.WEXITSTATUS(ws) != status:
        line("zombie: waitpid gave pid %d status %d, want %d exit %d" % (pid, ws, child, status))
    else: line("zombie: ok")
  except Exception as e:
    line("zombie: %r" % e)

if part == "fifo":
  try:
    got = os.read(ffd, 64)
    line("fifo: ok" if got == token else "fifo: read %r, want %r" % (got, token))
  except Exception as e:
    line("fifo: %r" % e)

if part == "unixsock":
  try:
    name = us.getsockname()
    try:
        us.accept(); line("unixsock: accept returned a connection nobody made")
    except BlockingIOError:
        dname = ud.getsockname()
        try:
            ud.recv(16); line("unixsock: a datagram nobody sent")
        except BlockingIOError:
            line("unixsock: ok" if (name, dname) == ("/tmp/ko.sock", "/tmp/ko.dgram") else "unixsock: getsockname %r %r" % (name, dname))
  except Exception as e:
    line("unixsock: %r" % e)

if part == "locks":
  got = held()
  names = [d + "/" + k for i, (d, k) in enumerate(kinds) if not got & (1 << i)]
  # The holder is still their owner: it converts each lock to shared and
  # back (EAGAIN here means the lock is held, but by an owner that is not
  # it), then lets go, and then another owner gets it.
  owned = []
  for d, k in kinds:
    fd = lk[d, k]
    try:
      for mode in ("sh", "ex"):
        if k == "posix": fcntl.lockf(fd, (fcntl.LOCK_SH if mode == "sh" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        elif k == "flock": fcntl.flock(fd, (fcntl.LOCK_SH if mode == "sh" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        else: ofd(fd, fcntl.F_RDLCK if mode == "sh" else fcntl.F_WRLCK)
      if k == "posix": fcntl.lockf(fd, fcntl.LOCK_UN)
      elif k == "flock": fcntl.flock(fd, fcntl.LOCK_UN)
      else: ofd(fd, fcntl.F_UNLCK)
    except OSError as e:
      owned.append("%s/%s (%s)" % (d, k, e.strerror))
  after = held()
  freed = [d + "/" + k for i, (d, k) in enumerate(kinds) if after & (1 << i)]
  if names: line("locks: not held after the restore: " + ", ".join(names))
  elif owned: line("locks: held, but not by their owner: " + ", ".join(owned))
  elif freed: line("locks: still held after their owner let go: " + ", ".join(freed))
  else: line("locks: ok")

if part == "tcpfull":
  try:
    tx.setblocking(True); tx.shutdown(socket.SHUT_WR)
    rx.settimeout(30)
    got = 0
    while True:
        b = rx.recv(1 << 20)
        if not b: break
        got += len(b)
    stop.set()
    rx2.settimeout(30)
    got2 = 0
    while True:  # its send returns as this reads; then it shuts down
        b = rx2.recv(1 << 20)
        if not b: break
        got2 += len(b)
    pumper.join(30)
    if got != sent: line("tcpfull: read %d bytes, the sender wrote %d" % (got, sent))
    elif got2 != blocked[0] or got2 == 0: line("tcpfull: the blocked sender's peer read %d bytes of %d" % (got2, blocked[0]))
    else: line("tcpfull: ok")
  except Exception as e:
    line("tcpfull: %r" % e)
line("done")
`

// KernelObjects checks five kinds of kernel objects across a checkpoint, a
// kill and a restore, each in a sandbox of its own (kernelObjectsPy): a
// zombie child, a FIFO whose path was unlinked, unix sockets whose paths
// were unlinked, TCP connections with full send buffers, and file locks. Each must come
// back as it was, or the checkpoint must fail with an error that names the
// object (never a stack dump) and leave the sandbox running, as Checkpoint
// promises. refused lists the parts a driver documents as refused at the
// checkpoint; a refused part that checkpoints after all is reported, so
// the list stays true.
func KernelObjects(t *testing.T, d Driver, tmpl sandbox.Template, refused ...string) {
	known := map[string]bool{}
	for _, r := range refused {
		known[r] = true
	}
	for _, name := range []string{"zombie", "fifo", "unixsock", "tcpfull", "locks"} {
		t.Run(name, func(t *testing.T) { kernelObject(t, d, tmpl, name, known[name]) })
	}
}

// kernelObjectWords name each object in the error of a refused checkpoint.
var kernelObjectWords = map[string][]string{
	"zombie":   {"zombie"},
	"fifo":     {"FIFO", "fifo"},
	"unixsock": {"unix socket"},
	"tcpfull":  {"TCP", "send buffer"},
	"locks":    {"lock"},
}

func kernelObject(t *testing.T, d Driver, tmpl sandbox.Template, name string, refused bool) {
	spec := create(t, d, "kobj-"+name, tmpl)
	mustSh(t, d, spec.ID, "cat > /tmp/ko.py <<'EOF'\n"+kernelObjectsPy+"\nEOF")
	pid := start(t, d, spec.ID, "python3", "/tmp/ko.py", name)
	if _, err := waitLog(d, spec.ID, pid, "ready ", time.Minute); err != nil {
		t.Fatal(err)
	}
	rs, err := cut(t, d, spec, lapper(t))
	if err == nil && len(rs.NotRestored) > 0 {
		// Everything here comes back, so the fidelity report must say so.
		t.Errorf("the restore reports state it did not bring back: %+v", rs.NotRestored)
	}
	if err != nil {
		msg := err.Error()
		named := false
		for _, w := range kernelObjectWords[name] {
			named = named || strings.Contains(msg, w)
		}
		switch {
		case !named:
			t.Fatalf("the checkpoint failed without naming the %s: %v", name, err)
		case strings.Contains(msg, "goroutine "), len(msg) > 2000:
			t.Fatalf("the checkpoint's error is a dump, not an explanation (%d bytes): %.300s", len(msg), msg)
		case !refused:
			t.Fatalf("the checkpoint of a sandbox holding a %s was refused: %v", name, err)
		}
		if out, err := sh(d, spec.ID, "echo alive", time.Minute); err != nil || strings.TrimSpace(out) != "alive" {
			t.Fatalf("after the refused checkpoint (%s) the sandbox does not run: %q %v", msg, out, err)
		}
		t.Logf("refused, as documented: %v", err)
		return
	}
	if refused {
		t.Errorf("the %s is listed as refused, but the checkpoint took it: update the driver's list", name)
	}
	mustSh(t, d, spec.ID, "touch /tmp/ko.go")
	if _, err := waitLog(d, spec.ID, pid, "done", time.Minute); err != nil {
		t.Fatalf("after the restore: %v", err)
	}
	log := procLog(d, spec.ID, pid)
	for _, l := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(l, name+": "); ok {
			if v != "ok" {
				t.Fatalf("the %s did not come back as it was: %s", name, v)
			}
			t.Logf("the %s came back as it was", name)
			return
		}
	}
	t.Fatalf("no %s line after the restore: %q", name, log)
}
