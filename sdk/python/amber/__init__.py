"""Amber's Python SDK: the REST API of an Amber daemon, standard library only.

    import amber
    c = amber.Client()                      # AMBER_ADDR / AMBER_TOKEN, or DATA_DIR/admin.key
    sb = c.create_sandbox("python")
    r = c.exec(sb, ["python3", "-c", "print(6*7)"])    # or a shell line: c.exec(sb, "ls | wc -l")
    assert r.stdout == b"42\\n" and r.code == 0
    ck = c.checkpoint(sb)
    c.kill(sb); c.recover(sb)
    fork = c.restore(ck, as_new=True)
    for ev in c.follow_events(sb): ...

Every failed call raises amber.Error with the API's error kind ("not found",
"invalid argument", ...), the HTTP status and the message. Streams (exec
output, followed events, checkpoint progress) are newline-delimited JSON read
as they arrive.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Client", "Error", "ExecResult", "OutputFrame"]

#: A sandbox, checkpoint or session: its id, or the dict the SDK returned for it.
Ref = Union[str, Mapping[str, Any]]
#: A process: its PID, or the dict of a process listing ({"pid": ...}).
PID = Union[int, Mapping[str, Any]]
#: Environment entries: {"KEY": "value"} or ["KEY=value", ...].
Env = Union[Mapping[str, str], Sequence[str], None]
JSON = Dict[str, Any]

# The HTTP status of each error kind (the daemon's errdefs.HTTPStatus): an
# error that arrives inside a stream, after the 200, carries the status its
# kind would have had as a plain answer.
_STATUS = {
    "not found": 404, "already exists": 409, "invalid argument": 400, "conflict": 409, "fenced": 409,
    "compacted": 410, "unavailable": 503, "data loss": 500, "permission denied": 403,
    "unauthenticated": 401, "resource exhausted": 429, "failed precondition": 412,
    "not implemented": 501, "too large": 413, "internal": 500,
}


class Error(Exception):
    """A failed API call: kind is one of the API's error kinds, status the
    HTTP status (for an error inside a stream: the status of its kind)."""

    def __init__(self, kind: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else _STATUS.get(kind, 500)

    def __str__(self) -> str:
        return "%s (%s)" % (self.message, self.kind)


def _frame_error(e: Mapping[str, Any]) -> Error:
    return Error(e.get("kind", "internal"), e.get("message", ""))


class ExecResult:
    """How a command ended, with its collected output."""

    def __init__(self, code: int, signal: Optional[str], timed_out: bool, stdout: bytes, stderr: bytes,
                 pid: Optional[int] = None) -> None:
        self.code = code
        self.signal = signal
        self.timed_out = timed_out
        self.stdout = stdout
        self.stderr = stderr
        self.pid = pid

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8."""
        return self.stdout.decode(errors="replace")

    def __repr__(self) -> str:
        return "ExecResult(code=%r, signal=%r, stdout=%r, stderr=%r)" % (
            self.code, self.signal, self.stdout[:80], self.stderr[:80])


class OutputFrame:
    """One piece of a process's output (Client.output): stream is "stdout",
    "stderr", "exited" (exit set), "rewound" or "lost"; offset is the byte
    offset of data in the process's output, from which a client re-attaches."""

    def __init__(self, stream: str, offset: int, data: bytes = b"", exit: Optional[JSON] = None, lost: int = 0) -> None:
        self.stream = stream
        self.offset = offset
        self.data = data
        self.exit = exit
        self.lost = lost

    def __repr__(self) -> str:
        return "OutputFrame(%r, offset=%r, data=%r)" % (self.stream, self.offset, self.data[:80])


def _id(x: Ref) -> str:
    """The id of x: an id, or a dict the SDK returned (a sandbox, a
    checkpoint, a session)."""
    if isinstance(x, str):
        return x
    if isinstance(x, Mapping) and isinstance(x.get("id"), str):
        return x["id"]
    raise Error("invalid argument", "%r is neither an id nor an object with one" % (x,))


def _pid(x: PID) -> int:
    if isinstance(x, bool):
        raise Error("invalid argument", "%r is not a PID" % (x,))
    if isinstance(x, int):
        return x
    if isinstance(x, Mapping) and isinstance(x.get("pid"), int):
        return x["pid"]
    raise Error("invalid argument", "%r is neither a PID nor a process" % (x,))


def _env(env: Env) -> Optional[List[str]]:
    if not env:
        return None
    if isinstance(env, Mapping):
        return ["%s=%s" % kv for kv in env.items()]
    return list(env)


def _command(args: Union[str, Sequence[str], None], cmd: Optional[str]) -> JSON:
    """The command of an exec or a start: args (argv, no shell) or cmd (a
    shell command line); a str given as args is a command line too."""
    if isinstance(args, str):
        args, cmd = None, args if cmd is None else cmd
    body: JSON = {}
    if args:
        body["args"] = list(args)
    if cmd is not None:
        body["cmd"] = cmd
    return body


def _default_token(data_dir: Optional[str]) -> Optional[str]:
    token = os.environ.get("AMBER_TOKEN")
    if token:
        return token
    path = os.path.join(data_dir or os.environ.get("AMBER_DATA_DIR", "/var/lib/amber"), "admin.key")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class Client:
    """A client of one Amber daemon.

    addr is "host:port" or a URL (default $AMBER_ADDR or 127.0.0.1:7777);
    token an API key (default $AMBER_TOKEN, else DATA_DIR/admin.key).
    Every method that names a sandbox, a checkpoint or a session takes its
    id or the dict the SDK returned for it (restore(ck) as restore(ck["id"])).
    """

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None, data_dir: Optional[str] = None,
                 timeout: float = 300) -> None:
        addr = addr or os.environ.get("AMBER_ADDR") or "127.0.0.1:7777"
        if "://" not in addr:
            addr = "http://" + addr
        u = urllib.parse.urlsplit(addr)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise Error("invalid argument", "daemon address %r is not host:port or a URL" % addr)
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._base = u.path.rstrip("/")
        self._token = token or _default_token(data_dir)
        self._timeout = timeout

    # --- plumbing -------------------------------------------------------

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self._timeout)

    def _request(self, method: str, path: str, query: Optional[Mapping[str, Any]] = None, body: Any = None,
                 ctype: Optional[str] = None, accept: Optional[str] = None,
                 idempotency_key: Optional[str] = None) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = self._base + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        headers = {}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        if ctype:
            headers["Content-Type"] = ctype
        if accept:
            headers["Accept"] = accept
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        conn = self._conn()
        try:
            conn.request(method, url, body=body, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise Error("unavailable", "%s %s: %s (is `amber up` running there?)" % (method, url, e)) from e
        if resp.status // 100 != 2:
            raw = resp.read(1 << 20)
            conn.close()
            try:
                e = json.loads(raw)["error"]
                kind, message = e.get("kind", "internal"), e.get("message", "")
            except (ValueError, KeyError, TypeError):
                raise Error("internal", "%s %s: HTTP %d: %s" % (method, url, resp.status, raw[:200].decode(errors="replace")), resp.status)
            raise Error(kind, message, resp.status)
        return conn, resp

    def _json(self, method: str, path: str, query: Optional[Mapping[str, Any]] = None, body: Any = None,
              idempotency_key: Optional[str] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        conn, resp = self._request(method, path, query, data, "application/json" if data is not None else None,
                                   idempotency_key=idempotency_key)
        try:
            raw = resp.read()
        finally:
            conn.close()
        return json.loads(raw) if raw.strip() else None

    def _frames(self, method: str, path: str, query: Optional[Mapping[str, Any]] = None, body: Any = None,
                ctype: Optional[str] = "application/json") -> Iterator[JSON]:
        """Yields the NDJSON frames of a streamed answer."""
        conn, resp = self._request(method, path, query, body, ctype, accept="application/x-ndjson")
        try:
            while True:
                try:
                    line = resp.readline()
                except OSError as e:
                    raise Error("unavailable", "%s %s: the stream broke: %s" % (method, path, e)) from e
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    @staticmethod
    def _sb(sid: Ref, rest: str = "") -> str:
        return "/v1/sandboxes/" + urllib.parse.quote(_id(sid), safe="") + rest

    # --- sandboxes ------------------------------------------------------

    def info(self) -> JSON:
        return self._json("GET", "/v1/info")

    def templates(self) -> List[JSON]:
        return self._json("GET", "/v1/templates")["templates"]

    # Template versions: immutable, named by the digest of their content;
    # names are tags. Listing and inspecting need any key, the rest the
    # operator's.

    def template_versions(self) -> List[JSON]:
        """Every template version here or in the blob store, with what
        references it."""
        return self._json("GET", "/v1/templates")["versions"]

    def inspect_template(self, ref: str) -> JSON:
        """The version ref names: "name", "name@sha256:..." or "sha256:..."."""
        return self._json("GET", "/v1/templates/" + urllib.parse.quote(ref, safe=""))

    def import_template(self, name: str, tarball: bytes, defaults: Optional[JSON] = None) -> JSON:
        """Imports a root filesystem tarball (bytes) as a version of name and
        moves tag name to it; returns {"version", "existed", "previous"}."""
        query = {"defaults": json.dumps(defaults)} if defaults else None
        conn, resp = self._request("POST", "/v1/templates/%s/import" % urllib.parse.quote(name, safe=""),
                                   query, tarball, "application/x-tar")
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def tag_template(self, name: str, version: str) -> JSON:
        return self._json("PUT", "/v1/templates/%s/tag" % urllib.parse.quote(name, safe=""), body={"version": version})

    def remove_template(self, ref: str) -> None:
        """Removes a tag ("name") or an unreferenced version."""
        self._json("DELETE", "/v1/templates/" + urllib.parse.quote(ref, safe=""))

    def gc_templates(self) -> List[str]:
        return self._json("POST", "/v1/templates/gc")["removed"]

    def upgrade_sandbox(self, sid: Ref, template: str) -> JSON:
        """Moves sandbox sid onto template (a reference): returns the new
        sandbox; the old one is checkpointed and stopped."""
        return self._json("POST", self._sb(sid, "/upgrade"), body={"template": template})

    def create_sandbox(self, template: str, memory_bytes: int = 0, millicpus: int = 0, env: Env = None,
                       recovery: Optional[str] = None, cold: bool = False,
                       idempotency_key: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
                       timeout: int = 0, on_timeout: Optional[str] = None) -> JSON:
        """Creates a sandbox. With idempotency_key, a retry of the same call
        returns the first sandbox instead of making a second. metadata are
        its labels (sandboxes(metadata=…) selects by them; keys beginning
        "amber." are Amber's own, refused with a 400); timeout, in
        seconds, its deadline, when it is killed (on_timeout "kill") or
        paused ("pause": checkpointed and stopped, resumed by the next call)."""
        body: JSON = {"template": template}
        limits = {k: v for k, v in (("memory_bytes", memory_bytes), ("millicpus", millicpus)) if v}
        if limits:
            body["limits"] = limits
        if env:
            body["env"] = _env(env)
        if recovery:
            body["recovery"] = recovery
        if cold:
            body["cold"] = True
        if metadata:
            body["metadata"] = dict(metadata)
        if timeout:
            body["timeout"] = timeout
        if on_timeout:
            body["on_timeout"] = on_timeout
        return self._json("POST", "/v1/sandboxes", body=body, idempotency_key=idempotency_key)

    def sandboxes(self, state: Optional[Sequence[str]] = None,
                  metadata: Optional[Mapping[str, str]] = None) -> List[JSON]:
        """The caller's sandboxes: with state, only those in these states
        (default: every state but destroyed); with metadata, only those
        whose metadata hold every pair."""
        query: Dict[str, Any] = {}
        if state:
            query["state"] = list(state)
        if metadata:
            query["metadata"] = [f"{k}={v}" for k, v in metadata.items()]
        return self._json("GET", "/v1/sandboxes", query=query or None)["sandboxes"]

    def set_timeout(self, sid: Ref, seconds: int) -> JSON:
        """Sets the sandbox's deadline to seconds from now (0 removes it)."""
        return self._json("POST", self._sb(sid, "/timeout"), body={"timeout": seconds})

    def sandbox(self, sid: Ref) -> JSON:
        return self._json("GET", self._sb(sid))

    def destroy(self, sid: Ref) -> None:
        self._json("DELETE", self._sb(sid))

    def kill(self, sid: Ref) -> JSON:
        """SIGKILLs every process of the sandbox: a crash, for testing."""
        return self._json("POST", self._sb(sid, "/kill"))

    def stats(self, sid: Ref) -> JSON:
        """The sandbox's resource use now: cpu_ns, memory_bytes,
        disk_used_bytes, disk_total_bytes."""
        return self._json("GET", self._sb(sid, "/stats"))

    # --- ports ------------------------------------------------------------

    def expose_port(self, sid: Ref, port: int) -> JSON:
        """Exposes a TCP port of the sandbox through the daemon; the answer's
        "url" is where HTTP and WebSocket clients reach it."""
        return self._json("POST", self._sb(sid, "/ports"), body={"port": int(port)})

    def ports(self, sid: Ref) -> List[JSON]:
        return self._json("GET", self._sb(sid, "/ports"))["ports"]

    def unexpose_port(self, sid: Ref, port: Union[int, Mapping[str, Any]]) -> None:
        n = port["port"] if isinstance(port, Mapping) else int(port)
        self._json("DELETE", self._sb(sid, "/ports/%d" % n))

    # --- exec and processes ----------------------------------------------

    def exec(self, sid: Ref, args: Union[str, Sequence[str], None] = None, env: Env = None, cwd: Optional[str] = None,
             stdin: Union[bytes, str, None] = None, timeout: Optional[float] = None,
             on_output: Optional[Callable[[str, bytes], None]] = None, cmd: Optional[str] = None) -> ExecResult:
        """Runs a command to completion; returns an ExecResult. The command
        is args, an argv run as is, or cmd (or args given as a str), a shell
        command line run by the sandbox's /bin/sh -c ("ls -la | wc -l").
        on_output(stream, data), when given, sees the output as it arrives."""
        body = _command(args, cmd)
        if env:
            body["env"] = _env(env)
        if cwd:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin if isinstance(stdin, bytes) else stdin.encode()).decode()
        if timeout:
            body["timeout_ms"] = int(timeout * 1000)
        out: List[bytes] = []
        err: List[bytes] = []
        pid = None
        for f in self._frames("POST", self._sb(sid, "/exec"), body=json.dumps(body).encode()):
            if f.get("error"):
                raise _frame_error(f["error"])
            if f.get("exit") is not None:
                x = f["exit"]
                return ExecResult(x.get("code", 0), x.get("signal"), x.get("timed_out", False), b"".join(out), b"".join(err), pid)
            if not f.get("stream"):
                pid = f.get("pid") or pid
                continue  # the {"pid": ...} frame
            data = base64.b64decode(f.get("data") or "")
            (out if f.get("stream") == "stdout" else err).append(data)
            if on_output:
                on_output(f["stream"], data)
        raise Error("unavailable", "exec in %s: the output stream broke before the exit status" % _id(sid))

    def start(self, sid: Ref, args: Union[str, Sequence[str], None] = None, env: Env = None, cwd: Optional[str] = None,
              cmd: Optional[str] = None, stdin: bool = False) -> int:
        """Starts a command in the background (args or cmd, as exec); returns
        its PID in the sandbox. With stdin, its stdin stays open for
        send_stdin; otherwise it reads end of file at once."""
        body = _command(args, cmd)
        if env:
            body["env"] = _env(env)
        if cwd:
            body["cwd"] = cwd
        if stdin:
            body["stdin"] = True
        return self._json("POST", self._sb(sid, "/processes"), body=body)["pid"]

    def processes(self, sid: Ref) -> List[JSON]:
        """The sandbox's processes (the tenant's: none of Amber's own)."""
        return self._json("GET", self._sb(sid, "/processes"))["processes"]

    def signal(self, sid: Ref, pid: PID, signal: str = "SIGTERM") -> None:
        self._json("POST", self._sb(sid, "/processes/%d/signal" % _pid(pid)), body={"signal": signal})

    def send_stdin(self, sid: Ref, pid: PID, data: Union[bytes, str], close: bool = False) -> None:
        """Sends data to the stdin of a process started with stdin=True;
        close closes its stdin after (the process reads end of file)."""
        if isinstance(data, str):
            data = data.encode()
        conn, resp = self._request("POST", self._sb(sid, "/processes/%d/stdin" % _pid(pid)),
                                   {"close": "true"} if close else None, data, "application/octet-stream")
        resp.read()
        conn.close()

    def output(self, sid: Ref, pid: PID, offset: int = 0, follow: bool = False,
               reconnect: bool = True) -> Iterator[OutputFrame]:
        """Yields a process's output from byte offset on (stdout and stderr
        in the order it wrote them; kept in the sandbox, so it is there after
        a daemon restart, a checkpoint or a restore). With follow, it goes on
        until the process ends, the last frame being "exited". A stream that
        breaks is opened again (reconnect) from the offset after the last
        byte yielded: each byte is yielded once. Keep frame.offset +
        len(frame.data) to re-attach later yourself."""
        n = _pid(pid)
        broke = 0
        while True:
            try:
                ended = False
                for f in self._frames("GET", self._sb(sid, "/processes/%d/output" % n),
                                      {"offset": offset, "follow": "true" if follow else "false"}, ctype=None):
                    stream = f.get("stream", "")
                    if stream == "error":
                        raise _frame_error(f.get("error") or {"kind": "unavailable", "message": "output stream failed"})
                    fr = OutputFrame(stream, f.get("offset", 0), base64.b64decode(f.get("data") or ""), f.get("exit"), f.get("lost", 0))
                    if stream in ("stdout", "stderr"):
                        end = fr.offset + len(fr.data)
                        if end <= offset:
                            continue
                        if fr.offset < offset:
                            fr.data, fr.offset = fr.data[offset - fr.offset:], offset
                        offset = end
                    elif stream in ("rewound", "lost"):
                        offset = fr.offset
                    broke = 0
                    yield fr
                    if stream == "exited":
                        ended = True
                        return
                if ended or not follow:
                    return
            except Error as e:
                if not (reconnect and follow and e.kind == "unavailable" and broke < 30):
                    raise
            broke += 1
            time.sleep(min(0.1 * broke, 2.0))

    def wait(self, sid: Ref, pid: PID, with_output: bool = False) -> Union[JSON, ExecResult]:
        """Waits for a started process to end; returns its exit status, or
        with with_output an ExecResult holding its output too (from the
        sandbox's kept output, the last 1 MiB)."""
        if not with_output:
            return self._json("POST", self._sb(sid, "/processes/%d/wait" % _pid(pid)))
        out: List[bytes] = []
        err: List[bytes] = []
        x: JSON = {}
        for f in self.output(sid, pid, follow=True):
            if f.stream == "stdout":
                out.append(f.data)
            elif f.stream == "stderr":
                err.append(f.data)
            elif f.stream == "exited":
                x = f.exit or {}
        return ExecResult(x.get("code", 0), x.get("signal"), x.get("timed_out", False), b"".join(out), b"".join(err), _pid(pid))

    # --- files ------------------------------------------------------------
    # Paths are absolute sandbox paths ("/root/x"); a relative one is an
    # "invalid argument" error, as are writes into /proc.

    def read_file(self, sid: Ref, path: str) -> bytes:
        conn, resp = self._request("GET", self._sb(sid, "/files"), {"path": path})
        try:
            return resp.read()
        finally:
            conn.close()

    def read_text(self, sid: Ref, path: str) -> str:
        return self.read_file(sid, path).decode()

    def write_file(self, sid: Ref, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        conn, resp = self._request("PUT", self._sb(sid, "/files"), {"path": path, "mode": "%04o" % mode},
                                   data, "application/octet-stream")
        resp.read()
        conn.close()

    def list_dir(self, sid: Ref, path: str) -> List[JSON]:
        return self._json("GET", self._sb(sid, "/files"), {"path": path})["entries"]

    def stat(self, sid: Ref, path: str) -> JSON:
        """The file's FileInfo: name, type (file, dir, symlink, other), size,
        mode, mod_time, link."""
        return self._json("GET", self._sb(sid, "/files"), {"path": path, "stat": "true"})

    def exists(self, sid: Ref, path: str) -> bool:
        try:
            self.stat(sid, path)
            return True
        except Error as e:
            if e.kind == "not found":
                return False
            raise

    def mkdir(self, sid: Ref, path: str, mode: int = 0o755) -> None:
        """Makes the directory path and its missing parents."""
        self._json("POST", self._sb(sid, "/files/mkdir"), {"path": path, "mode": "%04o" % mode})

    def remove(self, sid: Ref, path: str, recursive: bool = False) -> None:
        self._json("DELETE", self._sb(sid, "/files"), {"path": path, "recursive": str(recursive).lower()})

    def rename(self, sid: Ref, src: str, dst: str) -> None:
        """Renames src to dst inside the sandbox, as rename(2): an existing file at dst is replaced."""
        self._json("POST", self._sb(sid, "/files/rename"), body={"from": src, "to": dst})

    def watch(self, sid: Ref, path: str, recursive: bool = False) -> Iterator[JSON]:
        """Yields the changes under path as they happen ({"path", "op"}: op
        is create, write, remove, rename, chmod, or overflow), from the
        moment the call returns its first frame, until the caller stops."""
        for f in self._frames("GET", self._sb(sid, "/files/watch"),
                              {"path": path, "recursive": "true" if recursive else "false"}, ctype=None):
            if f.get("error"):
                raise _frame_error(f["error"])
            yield f

    # --- checkpoints ------------------------------------------------------

    def _operation(self, path: str, body: JSON, progress: Optional[Callable[[JSON], None]]) -> JSON:
        for f in self._frames("POST", path, body=json.dumps(body).encode()):
            if f.get("error"):
                raise _frame_error(f["error"])
            if f.get("progress"):
                if progress:
                    progress(f["progress"])
                continue
            return f.get("checkpoint") or f.get("sandbox")
        raise Error("unavailable", "POST %s: the answer broke off before its result" % path)

    def checkpoint(self, sid: Ref, tag: Optional[str] = None, stop: bool = False,
                   progress: Optional[Callable[[JSON], None]] = None) -> JSON:
        """Cuts and commits a checkpoint; progress(dict) sees phases and bytes."""
        body: JSON = {}
        if tag:
            body["tag"] = tag
        if stop:
            body["stop"] = True
        return self._operation(self._sb(sid, "/checkpoints"), body, progress)

    def checkpoints(self, sid: Ref, all: bool = False) -> List[JSON]:
        return self._json("GET", self._sb(sid, "/checkpoints"), {"all": "true"} if all else None)["checkpoints"]

    def restore(self, checkpoint: Ref, as_new: bool = False, progress: Optional[Callable[[JSON], None]] = None) -> JSON:
        """Restores a checkpoint (its id or the dict checkpoint() returned;
        as a new sandbox when as_new); returns the sandbox."""
        path = "/v1/checkpoints/" + urllib.parse.quote(_id(checkpoint), safe="") + "/restore"
        return self._operation(path, {"as_new": True} if as_new else {}, progress)

    def recover(self, sid: Ref, to_event: Optional[int] = None, progress: Optional[Callable[[JSON], None]] = None) -> JSON:
        """Restores a sandbox in place from its latest checkpoint (or the newest cut at or before to_event)."""
        return self._operation(self._sb(sid, "/recover"), {"to_event": to_event} if to_event else {}, progress)

    def delete_checkpoint(self, checkpoint: Ref) -> None:
        self._json("DELETE", "/v1/checkpoints/" + urllib.parse.quote(_id(checkpoint), safe=""))

    # --- events -----------------------------------------------------------

    def events(self, sid: Ref, start: int = 1, limit: int = 1000) -> List[JSON]:
        """The sandbox's events from position start."""
        return self._json("GET", self._sb(sid, "/events"), {"from": start, "limit": limit})["events"]

    def follow_events(self, sid: Ref, start: int = 1) -> Iterator[JSON]:
        """Yields the sandbox's events from position start as they happen."""
        for f in self._frames("GET", self._sb(sid, "/events"), {"from": start, "follow": "true"}, ctype=None):
            if f.get("error"):
                raise _frame_error(f["error"])
            yield f

    # --- agent sessions ---------------------------------------------------

    @staticmethod
    def _ses(sid: Ref, rest: str = "") -> str:
        return "/v1/sessions/" + urllib.parse.quote(_id(sid), safe="") + rest

    def create_session(self, definition: JSON) -> JSON:
        """Creates an agent session from its definition (a dict: model,
        system, tools, limits, template, policy, ...)."""
        return self._json("POST", "/v1/sessions", body=definition)

    def sessions(self) -> List[JSON]:
        return self._json("GET", "/v1/sessions")["sessions"]

    def session(self, sid: Ref) -> JSON:
        return self._json("GET", self._ses(sid))

    def send(self, sid: Ref, text: Optional[str] = None, type: str = "user_message", payload: Optional[JSON] = None,
             event_id: Optional[str] = None) -> JSON:
        """Posts a client event (a user message by default). event_id makes
        the post idempotent: a retry with the same id is appended once."""
        if payload is None:
            payload = {"text": text}
        body: JSON = {"type": type, "payload": payload}
        if event_id:
            body["id"] = event_id
        return self._json("POST", self._ses(sid, "/events"), body=body)

    def session_events(self, sid: Ref, after: int = 0, limit: int = 1000) -> List[JSON]:
        """The session's events after sequence number after."""
        return self._json("GET", self._ses(sid, "/events"), {"after": after, "limit": limit})["events"]

    def stream_session_events(self, sid: Ref, after: int = 0) -> Iterator[JSON]:
        """Yields the session's events after sequence number after, as they
        are appended (Server-Sent Events). Resume after a disconnect by
        passing the last seq seen: nothing is missed, nothing repeated."""
        conn, resp = self._request("GET", self._ses(sid, "/events/stream"), {"after": after}, accept="text/event-stream")
        try:
            data: List[str] = []
            eid: Optional[str] = None
            while True:
                raw = resp.readline()
                if not raw:
                    return
                line = raw.decode().rstrip("\r\n")
                if line.startswith("id:"):
                    eid = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    ev = json.loads("\n".join(data))
                    data = []
                    if ev.get("error") and not eid:
                        raise _frame_error(ev["error"])
                    if eid:  # live deltas carry no id and are not durable
                        yield ev
                    eid = None
        finally:
            conn.close()

    # --- tenants, keys, policy, quota, audit (the operator or a tenant admin) ---

    def create_tenant(self, tenant_id: str, name: Optional[str] = None) -> JSON:
        """Creates a tenant (the operator's key)."""
        body: JSON = {"id": tenant_id}
        if name:
            body["name"] = name
        return self._json("POST", "/v1/tenants", body=body)

    def tenants(self) -> List[JSON]:
        return self._json("GET", "/v1/tenants")["tenants"]

    def create_key(self, tenant: Ref, name: str, scopes: Sequence[str] = ("read", "write"),
                   expires_at: Optional[str] = None) -> JSON:
        """Creates an API key of tenant; the answer's "key" is shown only here."""
        body: JSON = {"name": name, "scopes": list(scopes)}
        if expires_at:
            body["expires_at"] = expires_at
        return self._json("POST", "/v1/tenants/%s/keys" % urllib.parse.quote(_id(tenant), safe=""), body=body)

    def keys(self, tenant: Ref) -> List[JSON]:
        return self._json("GET", "/v1/tenants/%s/keys" % urllib.parse.quote(_id(tenant), safe=""))["keys"]

    def revoke_key(self, tenant: Ref, name: Union[str, Mapping[str, Any]]) -> None:
        n = name["name"] if isinstance(name, Mapping) else name
        self._json("DELETE", "/v1/tenants/%s/keys/%s" % (urllib.parse.quote(_id(tenant), safe=""), urllib.parse.quote(n, safe="")))

    def tenant_policy(self, tenant: Ref, **changes: Any) -> JSON:
        """Returns tenant's recovery policy; with keyword arguments
        (recovery, fast_every, fast_interval_ms, fast_replay_budget_ms,
        keep_checkpoints, idle_timeout_ms), changes them first."""
        path = "/v1/tenants/%s/policy" % urllib.parse.quote(_id(tenant), safe="")
        p = self._json("GET", path)
        if changes:
            p.update(changes)
            p = self._json("PUT", path, body=p)
        return p

    def tenant_quota(self, tenant: Ref, **changes: Any) -> JSON:
        """Returns tenant's quota; with keyword arguments (max_sandboxes,
        max_memory_bytes, max_millicpus, max_checkpoint_bytes,
        requests_per_second), sets them first (the operator's key)."""
        path = "/v1/tenants/%s/quota" % urllib.parse.quote(_id(tenant), safe="")
        q = self._json("GET", path)
        if changes:
            q.update(changes)
            q = self._json("PUT", path, body=q)
        return q

    def audit(self, start: int = 1, tenant: Optional[Ref] = None) -> List[JSON]:
        """The audit trail's records from position start."""
        q: JSON = {"from": start}
        if tenant:
            q["tenant"] = _id(tenant)
        return self._json("GET", "/v1/audit", q)["records"]

    def verify_audit(self, tenant: Optional[Ref] = None) -> JSON:
        """Checks the audit trail's hash chain: {"ok": ..., "bad_seq": ..., "problem": ...}."""
        return self._json("GET", "/v1/audit/verify", {"tenant": _id(tenant)} if tenant else None)
