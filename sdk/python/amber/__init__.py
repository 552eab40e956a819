"""Amber's Python SDK: the REST API of an Amber daemon, standard library only.

    import amber
    c = amber.Client()                      # AMBER_ADDR / AMBER_TOKEN, or DATA_DIR/admin.key
    sb = c.create_sandbox("python")
    r = c.exec(sb["id"], ["python3", "-c", "print(6*7)"])
    assert r.stdout == b"42\\n" and r.code == 0
    ck = c.checkpoint(sb["id"])
    c.kill(sb["id"]); c.recover(sb["id"])
    for ev in c.follow_events(sb["id"]): ...

Every failed call raises amber.Error with the API's error kind ("not found",
"invalid argument", ...), the HTTP status and the message. Streams (exec
output, followed events, checkpoint progress) are newline-delimited JSON read
as they arrive.
"""

import base64
import http.client
import json
import os
import urllib.parse

__all__ = ["Client", "Error", "ExecResult"]


class Error(Exception):
    """A failed API call: kind is one of the API's error kinds."""

    def __init__(self, kind, message, status=None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status

    def __str__(self):
        return "%s (%s)" % (self.message, self.kind)


class ExecResult:
    """How an exec ended, with its collected output."""

    def __init__(self, code, signal, timed_out, stdout, stderr):
        self.code = code
        self.signal = signal
        self.timed_out = timed_out
        self.stdout = stdout
        self.stderr = stderr

    def __repr__(self):
        return "ExecResult(code=%r, signal=%r, stdout=%r, stderr=%r)" % (
            self.code, self.signal, self.stdout[:80], self.stderr[:80])


def _default_token(data_dir):
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
    """

    def __init__(self, addr=None, token=None, data_dir=None, timeout=300):
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

    def _conn(self):
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self._timeout)

    def _request(self, method, path, query=None, body=None, ctype=None, accept=None, idempotency_key=None):
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
                raise Error(e.get("kind", "internal"), e.get("message", ""), resp.status)
            except (ValueError, KeyError, TypeError):
                raise Error("internal", "%s %s: HTTP %d: %s" % (method, url, resp.status, raw[:200].decode(errors="replace")), resp.status)
        return conn, resp

    def _json(self, method, path, query=None, body=None, idempotency_key=None):
        data = None if body is None else json.dumps(body).encode()
        conn, resp = self._request(method, path, query, data, "application/json" if data is not None else None,
                                   idempotency_key=idempotency_key)
        try:
            raw = resp.read()
        finally:
            conn.close()
        return json.loads(raw) if raw.strip() else None

    def _frames(self, method, path, query=None, body=None, ctype="application/json"):
        """Yields the NDJSON frames of a streamed answer."""
        conn, resp = self._request(method, path, query, body, ctype, accept="application/x-ndjson")
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    @staticmethod
    def _sb(sid, rest=""):
        return "/v1/sandboxes/" + urllib.parse.quote(sid, safe="") + rest

    # --- sandboxes ------------------------------------------------------

    def info(self):
        return self._json("GET", "/v1/info")

    def templates(self):
        return self._json("GET", "/v1/templates")["templates"]

    # Template versions: immutable, named by the digest of their content;
    # names are tags. Listing and inspecting need any key, the rest the
    # operator's.

    def template_versions(self):
        """Every template version here or in the blob store, with what
        references it."""
        return self._json("GET", "/v1/templates")["versions"]

    def inspect_template(self, ref):
        """The version ref names: "name", "name@sha256:..." or "sha256:..."."""
        return self._json("GET", "/v1/templates/" + urllib.parse.quote(ref, safe=""))

    def import_template(self, name, tarball, defaults=None):
        """Imports a root filesystem tarball (bytes) as a version of name and
        moves tag name to it; returns {"version", "existed", "previous"}."""
        query = {"defaults": json.dumps(defaults)} if defaults else None
        conn, resp = self._request("POST", "/v1/templates/%s/import" % urllib.parse.quote(name, safe=""),
                                   query, tarball, "application/x-tar")
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def tag_template(self, name, version):
        return self._json("PUT", "/v1/templates/%s/tag" % urllib.parse.quote(name, safe=""), body={"version": version})

    def remove_template(self, ref):
        """Removes a tag ("name") or an unreferenced version."""
        self._json("DELETE", "/v1/templates/" + urllib.parse.quote(ref, safe=""))

    def gc_templates(self):
        return self._json("POST", "/v1/templates/gc")["removed"]

    def upgrade_sandbox(self, sid, template):
        """Moves sandbox sid onto template (a reference): returns the new
        sandbox; the old one is checkpointed and stopped."""
        return self._json("POST", self._sb(sid, "/upgrade"), body={"template": template})

    def create_sandbox(self, template, memory_bytes=0, millicpus=0, env=None, recovery=None, cold=False,
                       idempotency_key=None):
        """Creates a sandbox. With idempotency_key, a retry of the same call
        returns the first sandbox instead of making a second."""
        body = {"template": template}
        limits = {k: v for k, v in (("memory_bytes", memory_bytes), ("millicpus", millicpus)) if v}
        if limits:
            body["limits"] = limits
        if env:
            body["env"] = ["%s=%s" % kv for kv in env.items()] if isinstance(env, dict) else list(env)
        if recovery:
            body["recovery"] = recovery
        if cold:
            body["cold"] = True
        return self._json("POST", "/v1/sandboxes", body=body, idempotency_key=idempotency_key)

    def sandboxes(self):
        return self._json("GET", "/v1/sandboxes")["sandboxes"]

    def sandbox(self, sid):
        return self._json("GET", self._sb(sid))

    def destroy(self, sid):
        self._json("DELETE", self._sb(sid))

    def kill(self, sid):
        """SIGKILLs every process of the sandbox: a crash, for testing."""
        return self._json("POST", self._sb(sid, "/kill"))

    # --- exec and processes ----------------------------------------------

    def exec(self, sid, args, env=None, cwd=None, stdin=None, timeout=None, on_output=None):
        """Runs args to completion; returns an ExecResult. on_output(stream,
        data), when given, sees the output as it arrives."""
        body = {"args": list(args)}
        if env:
            body["env"] = ["%s=%s" % kv for kv in env.items()] if isinstance(env, dict) else list(env)
        if cwd:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin if isinstance(stdin, bytes) else stdin.encode()).decode()
        if timeout:
            body["timeout_ms"] = int(timeout * 1000)
        out, err = [], []
        for f in self._frames("POST", self._sb(sid, "/exec"), body=json.dumps(body).encode()):
            if f.get("error"):
                e = f["error"]
                raise Error(e.get("kind", "internal"), e.get("message", ""))
            if f.get("exit") is not None:
                x = f["exit"]
                return ExecResult(x.get("code", 0), x.get("signal"), x.get("timed_out", False), b"".join(out), b"".join(err))
            if not f.get("stream"):
                continue  # the {"pid": ...} frame
            data = base64.b64decode(f.get("data") or "")
            (out if f.get("stream") == "stdout" else err).append(data)
            if on_output:
                on_output(f.get("stream"), data)
        raise Error("unavailable", "exec in %s: the output stream broke before the exit status" % sid)

    def start(self, sid, args, env=None, cwd=None):
        """Starts args in the background; returns its PID in the sandbox."""
        body = {"args": list(args)}
        if env:
            body["env"] = ["%s=%s" % kv for kv in env.items()] if isinstance(env, dict) else list(env)
        if cwd:
            body["cwd"] = cwd
        return self._json("POST", self._sb(sid, "/processes"), body=body)["pid"]

    def processes(self, sid):
        return self._json("GET", self._sb(sid, "/processes"))["processes"]

    def signal(self, sid, pid, signal="SIGTERM"):
        self._json("POST", self._sb(sid, "/processes/%d/signal" % pid), body={"signal": signal})

    def wait(self, sid, pid):
        """Waits for a started process to end; returns its exit status."""
        return self._json("POST", self._sb(sid, "/processes/%d/wait" % pid))

    # --- files ------------------------------------------------------------

    def read_file(self, sid, path):
        conn, resp = self._request("GET", self._sb(sid, "/files"), {"path": path})
        try:
            return resp.read()
        finally:
            conn.close()

    def write_file(self, sid, path, data, mode=0o644):
        if isinstance(data, str):
            data = data.encode()
        conn, resp = self._request("PUT", self._sb(sid, "/files"), {"path": path, "mode": "%04o" % mode},
                                   data, "application/octet-stream")
        resp.read()
        conn.close()

    def list_dir(self, sid, path):
        return self._json("GET", self._sb(sid, "/files"), {"path": path})["entries"]

    def remove(self, sid, path, recursive=False):
        self._json("DELETE", self._sb(sid, "/files"), {"path": path, "recursive": str(recursive).lower()})

    def rename(self, sid, src, dst):
        """Renames src to dst inside the sandbox, as rename(2): an existing file at dst is replaced."""
        self._json("POST", self._sb(sid, "/files/rename"), body={"from": src, "to": dst})

    # --- checkpoints ------------------------------------------------------

    def _operation(self, path, body, progress):
        for f in self._frames("POST", path, body=json.dumps(body).encode()):
            if f.get("error"):
                e = f["error"]
                raise Error(e.get("kind", "internal"), e.get("message", ""))
            if f.get("progress"):
                if progress:
                    progress(f["progress"])
                continue
            return f.get("checkpoint") or f.get("sandbox")
        raise Error("unavailable", "POST %s: the answer broke off before its result" % path)

    def checkpoint(self, sid, tag=None, stop=False, progress=None):
        """Cuts and commits a checkpoint; progress(dict) sees phases and bytes."""
        body = {}
        if tag:
            body["tag"] = tag
        if stop:
            body["stop"] = True
        return self._operation(self._sb(sid, "/checkpoints"), body, progress)

    def checkpoints(self, sid, all=False):
        return self._json("GET", self._sb(sid, "/checkpoints"), {"all": "true"} if all else None)["checkpoints"]

    def restore(self, checkpoint_id, as_new=False, progress=None):
        """Restores a checkpoint (as a new sandbox when as_new); returns the sandbox."""
        path = "/v1/checkpoints/" + urllib.parse.quote(checkpoint_id, safe="") + "/restore"
        return self._operation(path, {"as_new": True} if as_new else {}, progress)

    def recover(self, sid, to_event=None, progress=None):
        """Restores a sandbox in place from its latest checkpoint (or the newest cut at or before to_event)."""
        return self._operation(self._sb(sid, "/recover"), {"to_event": to_event} if to_event else {}, progress)

    def delete_checkpoint(self, checkpoint_id):
        self._json("DELETE", "/v1/checkpoints/" + urllib.parse.quote(checkpoint_id, safe=""))

    # --- events -----------------------------------------------------------

    def events(self, sid, start=1, limit=1000):
        """The sandbox's events from position start."""
        return self._json("GET", self._sb(sid, "/events"), {"from": start, "limit": limit})["events"]

    def follow_events(self, sid, start=1):
        """Yields the sandbox's events from position start as they happen."""
        for f in self._frames("GET", self._sb(sid, "/events"), {"from": start, "follow": "true"}, ctype=None):
            if f.get("error"):
                e = f["error"]
                raise Error(e.get("kind", "internal"), e.get("message", ""))
            yield f

    # --- agent sessions ---------------------------------------------------

    @staticmethod
    def _ses(sid, rest=""):
        return "/v1/sessions/" + urllib.parse.quote(sid, safe="") + rest

    def create_session(self, definition):
        """Creates an agent session from its definition (a dict: model,
        system, tools, limits, template, policy, ...)."""
        return self._json("POST", "/v1/sessions", body=definition)

    def sessions(self):
        return self._json("GET", "/v1/sessions")["sessions"]

    def session(self, sid):
        return self._json("GET", self._ses(sid))

    def send(self, sid, text=None, type="user_message", payload=None, event_id=None):
        """Posts a client event (a user message by default). event_id makes
        the post idempotent: a retry with the same id is appended once."""
        if payload is None:
            payload = {"text": text}
        body = {"type": type, "payload": payload}
        if event_id:
            body["id"] = event_id
        return self._json("POST", self._ses(sid, "/events"), body=body)

    def session_events(self, sid, after=0, limit=1000):
        """The session's events after sequence number after."""
        return self._json("GET", self._ses(sid, "/events"), {"after": after, "limit": limit})["events"]

    def stream_session_events(self, sid, after=0):
        """Yields the session's events after sequence number after, as they
        are appended (Server-Sent Events). Resume after a disconnect by
        passing the last seq seen: nothing is missed, nothing repeated."""
        conn, resp = self._request("GET", self._ses(sid, "/events/stream"), {"after": after}, accept="text/event-stream")
        try:
            data, eid = [], None
            while True:
                line = resp.readline()
                if not line:
                    return
                line = line.decode().rstrip("\r\n")
                if line.startswith("id:"):
                    eid = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    ev = json.loads("\n".join(data))
                    data = []
                    if eid:  # live deltas carry no id and are not durable
                        yield ev
                    eid = None
        finally:
            conn.close()

    # --- tenants, keys, policy, quota, audit (the operator or a tenant admin) ---

    def create_tenant(self, tenant_id, name=None):
        """Creates a tenant (the operator's key)."""
        body = {"id": tenant_id}
        if name:
            body["name"] = name
        return self._json("POST", "/v1/tenants", body=body)

    def tenants(self):
        return self._json("GET", "/v1/tenants")["tenants"]

    def create_key(self, tenant, name, scopes=("read", "write"), expires_at=None):
        """Creates an API key of tenant; the answer's "key" is shown only here."""
        body = {"name": name, "scopes": list(scopes)}
        if expires_at:
            body["expires_at"] = expires_at
        return self._json("POST", "/v1/tenants/%s/keys" % urllib.parse.quote(tenant, safe=""), body=body)

    def keys(self, tenant):
        return self._json("GET", "/v1/tenants/%s/keys" % urllib.parse.quote(tenant, safe=""))["keys"]

    def revoke_key(self, tenant, name):
        self._json("DELETE", "/v1/tenants/%s/keys/%s" % (urllib.parse.quote(tenant, safe=""), urllib.parse.quote(name, safe="")))

    def tenant_policy(self, tenant, **changes):
        """Returns tenant's recovery policy; with keyword arguments
        (recovery, fast_every, fast_interval_ms, fast_replay_budget_ms,
        keep_checkpoints, idle_timeout_ms), changes them first."""
        path = "/v1/tenants/%s/policy" % urllib.parse.quote(tenant, safe="")
        p = self._json("GET", path)
        if changes:
            p.update(changes)
            p = self._json("PUT", path, body=p)
        return p

    def tenant_quota(self, tenant, **changes):
        """Returns tenant's quota; with keyword arguments (max_sandboxes,
        max_memory_bytes, max_millicpus, max_checkpoint_bytes,
        requests_per_second), sets them first (the operator's key)."""
        path = "/v1/tenants/%s/quota" % urllib.parse.quote(tenant, safe="")
        q = self._json("GET", path)
        if changes:
            q.update(changes)
            q = self._json("PUT", path, body=q)
        return q

    def audit(self, start=1, tenant=None):
        """The audit trail's records from position start."""
        q = {"from": start}
        if tenant:
            q["tenant"] = tenant
        return self._json("GET", "/v1/audit", q)["records"]

    def verify_audit(self, tenant=None):
        """Checks the audit trail's hash chain: {"ok": ..., "bad_seq": ..., "problem": ...}."""
        return self._json("GET", "/v1/audit/verify", {"tenant": tenant} if tenant else None)
