// The everyday calls (issue 22 §2): a shell command line, a missing
// program's 127 at once, bad env as a 400, background processes with
// stdin, output read from an offset and re-attached to, wait with output,
// and the file calls (exists, stat, mkdir, rename, watch) with absolute
// paths only, against a real daemon (see env.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AmberError, type OutputChunk, type Sandbox } from "../src/index.js";
import { operator, skipLive, text } from "./env.js";

describe("everyday calls", { skip: skipLive }, () => {
  const c = operator();
  let sb: Sandbox;

  before(async () => {
    sb = await c.createSandbox({ template: "minimal" });
  });
  after(async () => {
    if (sb) await c.destroySandbox(sb.id).catch(() => {});
  });

  test("exec takes a shell command line; a missing program is 127 at once; bad env is a 400", async () => {
    const r = await c.run(sb.id, "echo one two three | wc -w; exit 5");
    assert.equal(r.code, 5);
    assert.equal(r.text.trim(), "3");
    const streamed = await c.run(sb.id, "tr a-z A-Z", { stdin: new Blob(["streamed"]).stream() });
    assert.equal(streamed.text, "STREAMED");
    const t0 = Date.now();
    const missing = await c.run(sb.id, ["no-such-program"]);
    assert.equal(missing.code, 127);
    assert.ok(Date.now() - t0 < 2500, "a missing program is known at once");
    for (const env of [["NOEQUALS"], ["=v"], ["A=b\u0000c"]]) {
      await assert.rejects(c.run(sb.id, ["true"], { env }), (e: unknown) => e instanceof AmberError && e.status === 400);
    }
    // An error inside the exec stream carries its kind's status.
    await assert.rejects(c.run(sb.id, ["true"], { cwd: "/no/such/dir" }), (e: unknown) => e instanceof AmberError && e.kind === "invalid argument" && e.status === 400);
  });

  test("background processes: stdin, output by offset, wait with output", async () => {
    const pid = await c.start(sb.id, 'while read l; do echo "got:$l"; done; echo bye >&2', { stdin: true });
    const procs = await c.processes(sb.id);
    assert.ok(procs.some((p) => p.pid === pid));
    assert.ok(!procs.some((p) => p.pid === 1 || (p.args ?? []).join(" ").includes("amber")), JSON.stringify(procs));
    await c.sendStdin(sb.id, pid, "a\n");
    await c.sendStdin(sb.id, pid, new TextEncoder().encode("b\n"), { close: true });
    const chunks: OutputChunk[] = [];
    for await (const ch of c.output(sb.id, pid, { follow: true })) chunks.push(ch);
    const last = chunks[chunks.length - 1]!;
    assert.equal(last.stream, "exited");
    assert.equal(last.exit?.code, 0);
    const whole = chunks.filter((ch) => ch.stream === "stdout" || ch.stream === "stderr").map((ch) => text(ch.data)).join("");
    // stdout and stderr are separate pipes: their order between them is the agent's reading order.
    const stdout = chunks.filter((ch) => ch.stream === "stdout").map((ch) => text(ch.data)).join("");
    assert.equal(stdout, "got:a\ngot:b\n");
    assert.ok(whole.includes("bye\n"), whole);
    let rest = "";
    for await (const ch of c.output(sb.id, pid, { offset: 2 })) rest += text(ch.data);
    assert.equal(rest, whole.slice(2));
    const w = await c.waitOutput(sb.id, pid);
    assert.equal(w.code, 0);
    assert.equal(w.text, "got:a\ngot:b\n");
    assert.equal(text(w.stderr), "bye\n");
    const quiet = await c.start(sb.id, ["sleep", "30"]);
    await assert.rejects(c.sendStdin(sb.id, quiet, "x"), (e: unknown) => e instanceof AmberError && e.status === 400);
    await c.signal(sb.id, quiet, "KILL");
  });

  test("files: exists, stat, mkdir, rename, watch; relative paths and /proc writes refused", async () => {
    await c.mkdir(sb.id, "/root/w/sub");
    assert.equal(await c.exists(sb.id, "/root/w/sub"), true);
    assert.equal(await c.exists(sb.id, "/root/w/none"), false);
    assert.equal((await c.stat(sb.id, "/root/w/sub")).type, "dir");
    const ac = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      try {
        for await (const e of c.watch(sb.id, "/root/w", { recursive: true, signal: ac.signal })) {
          seen.push(`${e.path} ${e.op}`);
          if (e.path === "/root/w/sub/f") return;
        }
      } catch {
        // aborted
      }
    })();
    const deadline = Date.now() + 20000;
    while (!seen.some((s) => s.startsWith("/root/w/sub/f")) && Date.now() < deadline) {
      await c.writeFile(sb.id, "/root/w/sub/f", "x");
      await new Promise((r) => setTimeout(r, 300));
    }
    ac.abort();
    await watching;
    assert.ok(seen.some((s) => s.startsWith("/root/w/sub/f")), JSON.stringify(seen));
    await c.rename(sb.id, "/root/w/sub/f", "/root/w/g");
    assert.equal(await c.readText(sb.id, "/root/w/g"), "x");
    for (const bad of [() => c.readFile(sb.id, "root/w/g"), () => c.mkdir(sb.id, "rel"), () => c.writeFile(sb.id, "/proc/x", "y")]) {
      await assert.rejects(bad(), (e: unknown) => e instanceof AmberError && e.status === 400);
    }
  });
});
