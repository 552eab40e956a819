"""Tests of the Python SDK against a real daemon.

They run when AMBER_ADDR and AMBER_TOKEN name one (cmd/amber's
TestE2EPythonSDK installs the package in a venv, starts a daemon and runs
them with AMBER_SDK_INSTALLED=1; `make test` does that) and are skipped
otherwise. Without AMBER_SDK_INSTALLED they import the tree's package.
"""

import os
import sys
import threading
import time
import unittest

if not os.environ.get("AMBER_SDK_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import amber  # noqa: E402

LIVE = bool(os.environ.get("AMBER_ADDR") and os.environ.get("AMBER_TOKEN"))
COUNTER = 'R=$(od -An -N4 -tu4 /dev/urandom | tr -d " "); i=0; while :; do i=$((i+1)); echo "$R $i"; sleep 0.05; done'


@unittest.skipUnless(LIVE, "set AMBER_ADDR and AMBER_TOKEN to a running daemon")
class SDKTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = amber.Client()
        cls.sb = cls.c.create_sandbox("minimal", env={"GREETING": "hello"})

    @classmethod
    def tearDownClass(cls):
        try:
            cls.c.destroy(cls.sb["id"])
        except amber.Error:
            pass

    def test_1_exec(self):
        seen = []
        r = self.c.exec(self.sb["id"], ["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"],
                        on_output=lambda s, d: seen.append(s))
        self.assertEqual(r.code, 3)
        self.assertEqual(r.stdout, b"hello\n")
        self.assertEqual(r.stderr, b"oops\n")
        self.assertIn("stdout", seen)
        r = self.c.exec(self.sb["id"], ["cat"], stdin=b"from stdin")
        self.assertEqual(r.stdout, b"from stdin")

    def test_2_files(self):
        sid = self.sb["id"]
        self.c.write_file(sid, "/root/note.txt", "written by python\n", mode=0o600)
        self.assertEqual(self.c.read_file(sid, "/root/note.txt"), b"written by python\n")
        names = [e["name"] for e in self.c.list_dir(sid, "/root")]
        self.assertIn("note.txt", names)
        self.c.rename(sid, "/root/note.txt", "/root/moved.txt")
        self.assertEqual(self.c.read_file(sid, "/root/moved.txt"), b"written by python\n")
        self.c.rename(sid, "/root/moved.txt", "/root/note.txt")
        with self.assertRaises(amber.Error) as cm:
            self.c.read_file(sid, "/../../etc/shadow-does-not-exist")
        self.assertEqual(cm.exception.kind, "not found")

    def test_3_checkpoint_restore_events(self):
        sid = self.sb["id"]
        pid = self.c.start(sid, ["sh", "-c", COUNTER])
        time.sleep(0.3)
        phases = []
        ck = self.c.checkpoint(sid, tag="sdk", progress=lambda p: phases.append(p["phase"]))
        self.assertEqual(ck["state"], "committed")
        self.assertIn("upload", phases)
        before = self.c.exec(sid, ["sh", "-c", "tail -n 2 /run/amber/proc/%d.log | head -n 1" % pid]).stdout.split()
        self.assertIn(ck["id"], [c["id"] for c in self.c.checkpoints(sid)])

        followed = []
        stop = threading.Event()

        def follow():
            try:
                for ev in self.c.follow_events(sid):
                    followed.append(ev["type"])
                    if ev["type"] == "sandbox.restored":
                        stop.set()
                        return
            except amber.Error:
                stop.set()

        threading.Thread(target=follow, daemon=True).start()
        self.c.kill(sid)
        sb = self.c.recover(sid)
        self.assertEqual(sb["state"], "running")
        self.assertEqual(sb["origin"], ck["id"])
        after = self.c.exec(sid, ["sh", "-c", "tail -n 2 /run/amber/proc/%d.log | head -n 1" % pid]).stdout.split()
        self.assertEqual(after[0], before[0], "the counter's in-memory random value changed: restarted, not restored")
        self.assertTrue(stop.wait(30), "followed events never showed the restore: %r" % followed)
        self.assertEqual(followed[:2], ["sandbox.created", "sandbox.started"])
        self.assertIn("sandbox.checkpointed", followed)

        fork = self.c.restore(ck["id"], as_new=True) if self.c.info()["driver"] == "gvisor" else None
        if fork:
            self.assertNotEqual(fork["id"], sid)
            self.c.destroy(fork["id"])

    def test_5_idempotent_create(self):
        a = self.c.create_sandbox("minimal", idempotency_key="sdk-create-once", cold=True)
        try:
            b = self.c.create_sandbox("minimal", idempotency_key="sdk-create-once", cold=True)
            self.assertEqual(a["id"], b["id"])
        finally:
            self.c.destroy(a["id"])

    def test_6_tenants_quota_audit(self):
        tid = "sdk-%d" % os.getpid()
        self.c.create_tenant(tid, name="SDK test")
        self.assertIn(tid, [t["id"] for t in self.c.tenants()])
        k = self.c.create_key(tid, "dev", scopes=["read", "write"])
        self.assertTrue(k["key"].startswith("amber_"))
        self.assertEqual(self.c.tenant_quota(tid, max_sandboxes=1)["max_sandboxes"], 1)
        self.assertEqual(self.c.tenant_policy(tid, recovery="fast")["recovery"], "fast")
        dev = amber.Client(token=k["key"])
        sb = dev.create_sandbox("minimal", cold=True)
        try:
            self.assertEqual(sb["recovery"], "fast")
            with self.assertRaises(amber.Error) as cm:
                dev.create_sandbox("minimal", cold=True)
            self.assertEqual(cm.exception.status, 429)
            self.assertIn("max_sandboxes", cm.exception.message)
            with self.assertRaises(amber.Error) as cm:
                dev.tenant_quota(tid, max_sandboxes=5)
            self.assertIn(cm.exception.status, (403,))
        finally:
            dev.destroy(sb["id"])
        actions = [r["action"] for r in dev.audit()]
        self.assertIn("POST /v1/sandboxes", actions)
        v = dev.verify_audit()
        self.assertTrue(v["ok"], v)
        self.c.revoke_key(tid, "dev")
        with self.assertRaises(amber.Error) as cm:
            dev.sandboxes()
        self.assertEqual(cm.exception.status, 401)

    def test_7_templates(self):
        import io
        import tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data in (("bin/sh", b"#!not a shell\n"), ("etc/sdk-marker", b"sdk\n")):
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime = len(data), 0o755, 1700000000
                tf.addfile(ti, io.BytesIO(data))
        tarball = buf.getvalue()
        r = self.c.import_template("sdktpl", tarball, defaults={"cwd": "/etc"})
        self.assertFalse(r["existed"])
        digest = r["version"]["digest"]
        self.assertTrue(digest.startswith("sha256:"))
        self.assertTrue(self.c.import_template("sdktpl", tarball, defaults={"cwd": "/etc"})["existed"])
        v = self.c.inspect_template("sdktpl")
        self.assertEqual((v["digest"], v["cwd"], v["tags"]), (digest, "/etc", ["sdktpl"]))
        self.assertIn(digest, [x["digest"] for x in self.c.template_versions()])
        # Tagged: not removable; untagged and unreferenced: removed.
        with self.assertRaises(amber.Error) as cm:
            self.c.remove_template(digest)
        self.assertEqual(cm.exception.kind, "failed precondition")
        self.c.remove_template("sdktpl")
        self.assertIn(digest, self.c.gc_templates())
        with self.assertRaises(amber.Error) as cm:
            self.c.inspect_template(digest)
        self.assertEqual(cm.exception.kind, "not found")
        # The test sandbox is already on minimal's version.
        with self.assertRaises(amber.Error) as cm:
            self.c.upgrade_sandbox(self.sb["id"], "minimal")
        self.assertEqual(cm.exception.kind, "failed precondition")

    def test_8_session_stream_resume(self):
        script = [{"tool_calls": [{"name": "bash", "input": {"command": "echo from-the-agent"}}]},
                  {"text": "done"}]
        se = self.c.create_session({"model": {"adapter": "scripted", "script": script},
                                    "template": "minimal", "policy": "strict"})
        self.c.send(se["id"], "go", event_id="py-1")
        self.c.send(se["id"], "go", event_id="py-1")  # a retry: appended once
        seen = []
        for ev in self.c.stream_session_events(se["id"]):
            seen.append(ev)
            if ev["type"] == "session.status" and ev["payload"]["status"] == "idle" and \
                    any(e["type"] == "session.assistant_message" and e["payload"].get("text") == "done" for e in seen):
                break
        types = [e["type"] for e in seen]
        self.assertEqual(types.count("session.user_message"), 1)
        self.assertIn("session.tool_result", types)
        result = next(e for e in seen if e["type"] == "session.tool_result")
        self.assertIn("from-the-agent", result["payload"]["output"])
        # Resume from the middle: exactly the events after it, once each.
        mid = seen[len(seen) // 2]["seq"]
        again = []
        for ev in self.c.stream_session_events(se["id"], after=mid):
            again.append(ev)
            if ev["seq"] == seen[-1]["seq"]:
                break
        self.assertEqual([e["seq"] for e in again], [e["seq"] for e in seen if e["seq"] > mid])
        listed = self.c.session_events(se["id"])
        self.assertEqual([e["seq"] for e in listed][:len(seen)], [e["seq"] for e in seen])
        sb = self.c.session(se["id"]).get("sandbox")
        if sb:
            self.c.destroy(sb)

    def test_9a_shell_missing_program_env(self):
        sb = self.sb
        r = self.c.exec(sb, "echo one two three | wc -w")  # the object the SDK returned, a shell line
        self.assertEqual((r.code, r.text.strip()), (0, "3"))
        r = self.c.exec(sb["id"], cmd="exit 4")
        self.assertEqual(r.code, 4)
        t = time.time()
        r = self.c.exec(sb, ["no-such-program"])
        self.assertEqual(r.code, 127)
        self.assertLess(time.time() - t, 2.5, "a missing program is known at once")
        for env in (["NOEQUALS"], ["=v"], ["A=b\x00c"]):
            with self.assertRaises(amber.Error) as cm:
                self.c.exec(sb, ["true"], env=env)
            self.assertEqual((cm.exception.kind, cm.exception.status), ("invalid argument", 400))
        # An error inside the exec stream (after its 200) carries its status.
        with self.assertRaises(amber.Error) as cm:
            self.c.exec(sb, ["true"], cwd="/no/such/dir")
        self.assertEqual(cm.exception.status, 400)

    def test_9b_background_stdin_output_wait(self):
        sb = self.sb
        pid = self.c.start(sb, 'while read l; do echo "got:$l"; done; echo bye >&2', stdin=True)
        procs = self.c.processes(sb)
        self.assertIn(pid, [p["pid"] for p in procs])
        self.assertFalse([p for p in procs if p["pid"] == 1 or "amber" in " ".join(p["args"])], procs)
        self.c.send_stdin(sb, pid, "a\n")
        self.c.send_stdin(sb, {"pid": pid}, b"b\n", close=True)
        frames = list(self.c.output(sb, pid, follow=True))
        self.assertEqual(frames[-1].stream, "exited")
        self.assertEqual(frames[-1].exit["code"], 0)
        out = b"".join(f.data for f in frames if f.stream == "stdout")
        self.assertEqual(out, b"got:a\ngot:b\n")
        # Re-attach from an offset: the rest only, each byte once.
        first = next(f for f in frames if f.stream in ("stdout", "stderr"))
        rest = b"".join(f.data for f in self.c.output(sb, pid, offset=first.offset + 1))
        whole = b"".join(f.data for f in frames if f.stream in ("stdout", "stderr"))
        self.assertEqual(rest, whole[first.offset + 1:])
        w = self.c.wait(sb, pid, with_output=True)
        self.assertEqual((w.code, w.stdout, w.stderr), (0, b"got:a\ngot:b\n", b"bye\n"))
        self.assertEqual(self.c.wait(sb, pid)["code"], 0)
        quiet = self.c.start(sb, ["sleep", "30"])
        with self.assertRaises(amber.Error) as cm:
            self.c.send_stdin(sb, quiet, "x")
        self.assertEqual(cm.exception.status, 400)
        self.c.signal(sb, quiet, "KILL")

    def test_9c_files(self):
        sb = self.sb
        self.c.mkdir(sb, "/root/d/e")
        self.assertTrue(self.c.exists(sb, "/root/d/e"))
        self.assertFalse(self.c.exists(sb, "/root/d/nope"))
        self.assertEqual(self.c.stat(sb, "/root/d/e")["type"], "dir")
        seen = []

        def watch():
            try:
                for ev in self.c.watch(sb, "/root/d", recursive=True):
                    seen.append((ev["path"], ev["op"]))
                    if ev["path"] == "/root/d/e/f":
                        return
            except amber.Error:
                pass

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        deadline = time.time() + 20
        while th.is_alive() and not seen and time.time() < deadline:
            self.c.write_file(sb, "/root/d/e/f", "x")
            time.sleep(0.3)
        th.join(20)
        self.assertIn("/root/d/e/f", [p for p, _ in seen])
        self.c.rename(sb, "/root/d/e/f", "/root/d/g")
        self.assertEqual(self.c.read_text(sb, "/root/d/g"), "x")
        for bad in (lambda: self.c.read_file(sb, "root/d/g"), lambda: self.c.mkdir(sb, "rel"),
                    lambda: self.c.write_file(sb, "/proc/x", "y")):
            with self.assertRaises(amber.Error) as cm:
                bad()
            self.assertEqual(cm.exception.status, 400)
        self.c.remove(sb, "/root/d", recursive=True)

    def test_9d_objects_ports_stats(self):
        sb = self.c.sandbox(self.sb)
        self.assertEqual(sb["id"], self.sb["id"])
        st = self.c.stats(sb)
        self.assertGreater(st["memory_bytes"], 0)
        p = self.c.expose_port(sb, 8080)
        self.assertIn("8080", p["url"])
        self.assertIn(8080, [x["port"] for x in self.c.ports(sb)])
        self.c.unexpose_port(sb, p)
        self.assertNotIn(8080, [x["port"] for x in self.c.ports(sb)])
        ck = self.c.checkpoint(sb, tag="objects")
        self.assertIn(ck["id"], [c["id"] for c in self.c.checkpoints(sb)])
        again = self.c.restore(ck)  # the checkpoint object, not its id
        self.assertEqual(again["id"], sb["id"])
        self.c.delete_checkpoint(ck)
        with self.assertRaises(amber.Error) as cm:
            self.c.restore({"no": "id"})
        self.assertEqual(cm.exception.kind, "invalid argument")

    def test_9e_metadata_timeout_filters(self):
        tag = "py-%d" % time.time_ns()
        a = self.c.create_sandbox("minimal", metadata={"run": tag, "role": "a"}, timeout=3600)
        try:
            self.assertEqual(a["metadata"], {"run": tag, "role": "a"})
            self.assertIn("expires_at", a)
            self.assertEqual([s["id"] for s in self.c.sandboxes(metadata={"run": tag})], [a["id"]])
            self.assertEqual(self.c.sandboxes(metadata={"run": tag, "role": "b"}), [])
            self.assertEqual(self.c.sandboxes(state=["stopped"], metadata={"run": tag}), [])
            self.assertEqual(len(self.c.sandboxes(state=["running"], metadata={"run": tag})), 1)
            moved = self.c.set_timeout(a["id"], 60)
            self.assertNotEqual(moved["expires_at"], a["expires_at"])
            with self.assertRaises(amber.Error) as cm:
                self.c.create_sandbox("minimal", metadata={"a=b": "x"})
            self.assertEqual(cm.exception.status, 400)
            # Keys beginning "amber." are Amber's own labels: refused at
            # create, naming the key; selecting by them is open.
            with self.assertRaises(amber.Error) as cm:
                self.c.create_sandbox("minimal", metadata={"run": tag, "amber.session": tag})
            self.assertEqual((cm.exception.status, cm.exception.kind), (400, "invalid argument"))
            self.assertIn('"amber.session"', cm.exception.message)
            self.assertIn("reserved", cm.exception.message)
            self.assertEqual(self.c.sandboxes(metadata={"amber.session": tag}), [])
            self.assertEqual([s["id"] for s in self.c.sandboxes(metadata={"run": tag})], [a["id"]])
        finally:
            self.c.destroy(a["id"])

    def test_4_errors(self):
        with self.assertRaises(amber.Error) as cm:
            self.c.sandbox("sbx-doesnotexist")
        self.assertEqual(cm.exception.kind, "not found")
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(amber.Error) as cm:
            self.c.create_sandbox("no-such-template")
        self.assertIn(cm.exception.status, (400, 404))
        bad = amber.Client(token="amber_not_a_key")
        with self.assertRaises(amber.Error) as cm:
            bad.sandboxes()
        self.assertEqual(cm.exception.status, 401)


if __name__ == "__main__":
    unittest.main()
