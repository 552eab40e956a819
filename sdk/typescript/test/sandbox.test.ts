// Sandboxes, streamed exec, files, checkpoints and restores, sandbox events
// and idempotency keys, against a real daemon (see env.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AmberError, Client, type Event, type Sandbox } from "../src/index.js";
import { CuttableProxy } from "./proxy.js";
import { eventually, operator, skipLive, text, unique } from "./env.js";

// A shell loop whose first field is a random number drawn once, in memory:
// after a restore it is the same only if the process was restored, not
// restarted.
const COUNTER = 'R=$(od -An -N4 -tu4 /dev/urandom | tr -d " "); i=0; while :; do i=$((i+1)); echo "$R $i" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done';

describe("sandboxes", { skip: skipLive }, () => {
  const c = operator();
  let sb: Sandbox;

  before(async () => {
    sb = await c.createSandbox({ template: "minimal", env: ["GREETING=hello"] });
  });
  after(async () => {
    if (sb) await c.destroySandbox(sb.id).catch(() => {});
  });

  test("create, list, get", async () => {
    assert.equal(sb.state, "running");
    assert.equal(sb.template, "minimal");
    assert.match(sb.id, /^sbx-/);
    const listed = await c.listSandboxes();
    assert.ok(listed.some((s) => s.id === sb.id), "the new sandbox is listed");
    const got = await c.getSandbox(sb.id);
    assert.equal(got.id, sb.id);
    assert.equal(got.state, "running");
    assert.deepEqual(got.limits, sb.limits);
  });

  test("metadata, timeout and list filters", async () => {
    const tag = unique("md");
    const a = await c.createSandbox({ template: "minimal", metadata: { run: tag, role: "a" }, timeout: 3600 });
    try {
      assert.equal(a.metadata?.run, tag);
      assert.ok(a.expires_at && Date.parse(a.expires_at) > Date.now() + 3500_000, `expires_at ${a.expires_at}`);
      const mine = await c.listSandboxes({ metadata: { run: tag } });
      assert.deepEqual(mine.map((s) => s.id), [a.id]);
      assert.deepEqual(await c.listSandboxes({ metadata: { run: tag, role: "b" } }), []);
      assert.deepEqual((await c.listSandboxes({ state: ["stopped"], metadata: { run: tag } })).length, 0);
      const moved = await c.setTimeout(a.id, 60);
      assert.ok(moved.expires_at && Date.parse(moved.expires_at) < Date.now() + 61_000, `moved to ${moved.expires_at}`);
      await assert.rejects(c.setTimeout(a.id, -1), (e: unknown) => e instanceof AmberError && e.status === 400);
      // Keys beginning "amber." are Amber's own labels: refused at create,
      // naming the key; selecting by them is open.
      await assert.rejects(
        c.createSandbox({ template: "minimal", metadata: { run: tag, "Amber.Session": tag } }),
        (e: unknown) => e instanceof AmberError && e.status === 400 && e.message.includes('"Amber.Session"') && e.message.includes("reserved"),
      );
      assert.deepEqual(await c.listSandboxes({ metadata: { "amber.session": tag } }), []);
      assert.deepEqual((await c.listSandboxes({ metadata: { run: tag } })).map((s) => s.id), [a.id]);
    } finally {
      await c.destroySandbox(a.id).catch(() => {});
    }
  });

  test("exec streams stdout and stderr and ends with the exit code", async () => {
    const ex = c.exec(sb.id, ["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"]);
    const seen: string[] = [];
    for await (const chunk of ex) seen.push(`${chunk.stream}:${text(chunk.data)}`);
    assert.ok(seen.includes("stdout:hello\n"), `stdout chunk in ${JSON.stringify(seen)}`);
    assert.ok(seen.includes("stderr:oops\n"), `stderr chunk in ${JSON.stringify(seen)}`);
    assert.equal(ex.exit?.code, 3);
    const r = await ex.result();
    assert.equal(r.code, 3);
    assert.equal(r.text, "hello\n");
    assert.equal(text(r.stderr), "oops\n");

    const env = await c.run(sb.id, ["sh", "-c", "echo $A-$B; pwd"], { env: { A: "x", B: "y" }, cwd: "/tmp" });
    assert.equal(env.text, "x-y\n/tmp\n");
    const bin = new Uint8Array([0, 1, 2, 250, 255, 10]);
    assert.deepEqual((await c.run(sb.id, ["cat"], { stdin: bin })).stdout, bin);
    assert.equal((await c.run(sb.id, ["cat"], { stdin: "from stdin" })).text, "from stdin");
    const killed = await c.run(sb.id, ["sh", "-c", "kill -9 $$"]);
    assert.equal(killed.code, 137);
    const slow = await c.run(sb.id, ["sleep", "30"], { timeoutMs: 300 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.signal, "SIGKILL");
  });

  test("exec output arrives while the command runs, and stdin can be fed as it runs", async () => {
    // Each line is answered before the next is sent: only a stream in
    // both directions at once can pass.
    let feed!: ReadableStreamDefaultController<Uint8Array>;
    const stdin = new ReadableStream<Uint8Array>({ start: (ctl) => void (feed = ctl) });
    const ex = c.exec(sb.id, ["sh", "-c", 'while read l; do echo "got:$l"; done; echo eof'], { stdin });
    const lines = ["one", "two", "three"];
    feed.enqueue(new TextEncoder().encode(lines[0] + "\n"));
    let out = "";
    let i = 0;
    for await (const chunk of ex) {
      out += text(chunk.data);
      while (i < lines.length && out.includes(`got:${lines[i]}\n`)) {
        i++;
        if (i < lines.length) feed.enqueue(new TextEncoder().encode(lines[i] + "\n"));
        else feed.close();
      }
    }
    assert.equal(out, "got:one\ngot:two\ngot:three\neof\n");
    assert.equal(ex.exit?.code, 0);

    // An async iterable works as stdin too.
    async function* gen() {
      yield "a\n";
      yield new TextEncoder().encode("b\n");
    }
    assert.equal((await c.run(sb.id, ["wc", "-l"], { stdin: gen() })).text.trim(), "2");
  });

  test("an aborted exec rejects with the abort's reason", async () => {
    const ac = new AbortController();
    const ex = c.exec(sb.id, ["sh", "-c", "echo started; sleep 60"], { signal: ac.signal });
    const why = new Error("caller gave up");
    await assert.rejects(
      (async () => {
        for await (const chunk of ex) if (text(chunk.data).includes("started")) ac.abort(why);
      })(),
      (e) => e === why,
    );
    assert.equal(ex.exit, undefined);
  });

  test("followed events resume after a cut connection, each once", async () => {
    // A cold sandbox's log holds its creation; its destruction is appended
    // after the connection was cut, so only a reconnection can see it.
    const cold = await c.createSandbox({ template: "minimal", cold: true });
    const proxy = await CuttableProxy.start(process.env.AMBER_ADDR!);
    try {
      const via = new Client({ addr: proxy.addr, token: process.env.AMBER_TOKEN! });
      const got: Event[] = [];
      const resumedAt: number[] = [];
      for await (const ev of via.followEvents(cold.id, { retryDelayMs: 50, onReconnect: (next) => resumedAt.push(next) })) {
        got.push(ev);
        if (got.length === 1) {
          proxy.cut();
          await c.destroySandbox(cold.id);
        }
        if (ev.type === "sandbox.destroyed") break;
      }
      const want = (await c.events(cold.id)).events;
      assert.deepEqual(got.map((e) => [e.seq, e.id]), want.map((e) => [e.seq, e.id]));
      assert.ok(proxy.connections >= 2, "never reconnected");
      assert.ok(resumedAt.length >= 1 && resumedAt.every((n) => n >= 2), JSON.stringify(resumedAt));
      const resumed = proxy.heads.slice(1).map((h) => h.split("\r\n")[0]!);
      assert.ok(resumed.some((l) => /[?&]from=([2-9]|\d\d+)[& ]/.test(l)), JSON.stringify(resumed));
    } finally {
      await proxy.close();
      await c.destroySandbox(cold.id).catch(() => {});
    }
  });

  test("exec errors", async () => {
    await assert.rejects(c.run("sbx-doesnotexist", ["true"]), (e: AmberError) => e.status === 404 && e.kind === "not found");
    await assert.rejects(c.run(sb.id, []), (e: AmberError) => e.kind === "invalid argument");
    const missing = await c.run(sb.id, ["/no/such/binary"]);
    assert.equal(missing.code, 127);
    assert.match(text(missing.stderr), /no such file/);
  });

  test("files: write, read, list, stat, remove", async () => {
    await c.writeFile(sb.id, "/root/note.txt", "written by typescript\n", { mode: 0o600 });
    assert.equal(await c.readText(sb.id, "/root/note.txt"), "written by typescript\n");
    const bin = new Uint8Array(70_000).map((_, i) => (i * 7) % 256);
    await c.writeFile(sb.id, "/root/blob.bin", bin);
    assert.deepEqual(await c.readFile(sb.id, "/root/blob.bin"), bin);
    const entries = await c.listDir(sb.id, "/root");
    const note = entries.find((e) => e.name === "note.txt");
    assert.ok(note, `note.txt in ${JSON.stringify(entries.map((e) => e.name))}`);
    assert.equal(note.type, "file");
    assert.equal(note.size, 22);
    const st = await c.stat(sb.id, "/root/note.txt");
    assert.equal(st.mode, "0600");
    // What a file says inside the sandbox is what the API wrote.
    assert.equal((await c.run(sb.id, ["cat", "/root/note.txt"])).text, "written by typescript\n");
    // A tree as a tar, streamed out of one directory and into another.
    await c.mkdir(sb.id, "/root/tree/sub");
    await c.writeFile(sb.id, "/root/tree/sub/leaf.txt", "leaf\n");
    await c.putTar(sb.id, "/root/copy", await c.getTar(sb.id, "/root/tree"));
    // Entries are named from the directory's own name (tree/sub/leaf.txt).
    assert.equal(await c.readText(sb.id, "/root/copy/tree/sub/leaf.txt"), "leaf\n");
    await c.remove(sb.id, "/root/tree", { recursive: true });
    await c.remove(sb.id, "/root/copy", { recursive: true });
    await c.mkdir(sb.id, "/root/d/e");
    assert.equal((await c.stat(sb.id, "/root/d/e")).type, "dir");
    await c.remove(sb.id, "/root/d", { recursive: true });
    await c.remove(sb.id, "/root/blob.bin");
    await assert.rejects(c.readFile(sb.id, "/root/blob.bin"), (e: AmberError) => e.status === 404 && e.kind === "not found");
    await assert.rejects(c.readFile(sb.id, "/../../etc/shadow-does-not-exist"), (e: AmberError) => e.kind === "not found");
    await assert.rejects(c.listDir(sb.id, "/root/note.txt"), (e: AmberError) => e.kind === "invalid argument");
    await assert.rejects(c.readFile(sb.id, "/root"), (e: AmberError) => e.kind === "invalid argument");
  });

  test("checkpoint, kill, recover: a file and a running process come back", async () => {
    const pid = await c.start(sb.id, ["sh", "-c", COUNTER]);
    assert.ok(pid > 0);
    await c.writeFile(sb.id, "/root/state.txt", "before the checkpoint\n");
    const r0 = await eventually("the counter runs", 30_000, async () => {
      const s = await c.readText(sb.id, "/tmp/counter");
      return s.trim() ? s.split(" ")[0] : undefined;
    });

    const phases: string[] = [];
    const ckKey = unique("ts-ckpt");
    const ck = await c.checkpoint(sb.id, { tag: "ts-sdk", idempotencyKey: ckKey, onProgress: (p) => phases.push(p.phase) });
    assert.equal(ck.state, "committed");
    // A retry with the key is answered from the record: the same checkpoint, no second cut.
    assert.equal((await c.checkpoint(sb.id, { tag: "ts-sdk", idempotencyKey: ckKey })).id, ck.id);
    assert.equal((await c.checkpoints(sb.id)).filter((x) => x.tag === "ts-sdk").length, 1);
    assert.equal(ck.sandbox_id, sb.id);
    assert.equal(ck.tag, "ts-sdk");
    assert.ok(phases.includes("upload"), `progress phases ${JSON.stringify(phases)}`);
    assert.ok((await c.checkpoints(sb.id)).some((x) => x.id === ck.id));
    assert.equal((await c.getCheckpoint(ck.id)).id, ck.id);

    // Changed after the cut: the recovery must bring back the old content.
    await c.writeFile(sb.id, "/root/state.txt", "after the checkpoint\n");

    // Follow the events while the sandbox is killed and recovered.
    const ac = new AbortController();
    const followed: Event[] = [];
    const restored = (async () => {
      for await (const ev of c.followEvents(sb.id, { signal: ac.signal })) {
        followed.push(ev);
        if (ev.type === "sandbox.restored") return ev;
      }
      return undefined;
    })();

    await c.kill(sb.id);
    const phasesR: string[] = [];
    const back = await c.recover(sb.id, { onProgress: (p) => phasesR.push(p.phase) });
    assert.equal(back.state, "running");
    assert.equal(back.origin, ck.id);
    assert.ok((back.generation ?? 0) >= 1);
    assert.ok(phasesR.includes("restore"), `recover phases ${JSON.stringify(phasesR)}`);
    assert.equal(await c.readText(sb.id, "/root/state.txt"), "before the checkpoint\n");
    const r1 = await eventually("the counter runs again", 30_000, async () => {
      const s = await c.readText(sb.id, "/tmp/counter");
      return s.trim() ? s.split(" ")[0] : undefined;
    });
    assert.equal(r1, r0, "the counter's in-memory random value changed: restarted, not restored");

    const ev = await Promise.race([restored, new Promise<undefined>((r) => setTimeout(r, 30_000))]);
    ac.abort();
    assert.ok(ev, `followed events never showed the restore: ${JSON.stringify(followed.map((e) => e.type))}`);
    const types = followed.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ["sandbox.created", "sandbox.started"]);
    assert.ok(types.includes("sandbox.checkpointed"), JSON.stringify(types));
    const seqs = followed.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1), "followed events are the log in order, once each");
    const listed = await c.events(sb.id);
    assert.deepEqual(listed.events.slice(0, seqs.length).map((e) => e.seq), seqs);

    // Back to an earlier event: a second checkpoint exists, but recovering
    // to the first one's event picks the first.
    await c.writeFile(sb.id, "/root/state.txt", "at the second checkpoint\n");
    const ck2 = await c.checkpoint(sb.id, { tag: "ts-sdk-2" });
    assert.ok(ck.event_seq && ck2.event_seq && ck2.event_seq > ck.event_seq, `event_seq ${ck.event_seq} then ${ck2.event_seq}`);
    const earlier = await c.recover(sb.id, { toEvent: ck.event_seq });
    assert.equal(earlier.origin, ck.id);
    assert.equal(await c.readText(sb.id, "/root/state.txt"), "before the checkpoint\n");

    if ((await c.info()).driver === "gvisor") {
      // A fork of the same checkpoint: a new sandbox with the old state.
      const fork = await c.restore(ck.id, { asNew: true });
      try {
        assert.notEqual(fork.id, sb.id);
        assert.equal(fork.origin, ck.id);
        assert.equal(await c.readText(fork.id, "/root/state.txt"), "before the checkpoint\n");
      } finally {
        await c.destroySandbox(fork.id);
      }
    }
  });

  test("idempotency keys: a retry gets the first answer, another body is refused", async () => {
    const key = unique("ts-create");
    const a = await c.createSandbox({ template: "minimal", cold: true }, { idempotencyKey: key });
    try {
      const b = await c.createSandbox({ template: "minimal", cold: true }, { idempotencyKey: key });
      assert.equal(b.id, a.id);
      await assert.rejects(
        c.createSandbox({ template: "minimal", cold: true, env: ["X=1"] }, { idempotencyKey: key }),
        (e: AmberError) => e.status === 400 && e.kind === "invalid argument",
      );
      const without = await c.createSandbox({ template: "minimal", cold: true });
      assert.notEqual(without.id, a.id);
      await c.destroySandbox(without.id);
    } finally {
      await c.destroySandbox(a.id);
    }
  });

  test("destroy: gone from the list, and its state says so", async () => {
    const tmp = await c.createSandbox({ template: "minimal", cold: true });
    await c.destroySandbox(tmp.id);
    assert.ok(!(await c.listSandboxes()).some((s) => s.id === tmp.id));
    assert.equal((await c.getSandbox(tmp.id)).state, "destroyed");
  });

  test("errors carry the API's kind and status", async () => {
    await assert.rejects(c.getSandbox("sbx-doesnotexist"), (e: AmberError) => {
      assert.ok(e instanceof AmberError);
      assert.equal(e.status, 404);
      assert.equal(e.kind, "not found");
      return true;
    });
    await assert.rejects(c.getSandbox("NOT A VALID ID"), (e: AmberError) => e.status === 400 && e.kind === "invalid argument");
    await assert.rejects(c.createSandbox({ template: "no-such-template" }), (e: AmberError) => e.status === 400 || e.status === 404);
    await assert.rejects(c.getCheckpoint("ckp-doesnotexist"), (e: AmberError) => e.status === 404);
  });
});
