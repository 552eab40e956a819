// A scripted MCP session with the official TypeScript SDK's client over
// streamable HTTP, as an agent would run one (cmd/amber's
// TestE2EMCPClients runs it against a daemon): initialize, list the tools,
// create a sandbox, exec with progress, write and read files, a background
// process, checkpoint with progress, fork, list checkpoints, an exec
// cancelled mid-run (its process must be gone from ps), destroy, end the
// session. Any error the SDK reports (onerror of the transport or the
// client) or prints (console.error, console.warn) fails the script, as
// does any unexpected answer. Environment: AMBER_MCP_URL, AMBER_TOKEN.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import assert from "node:assert/strict";

const errors = [];
for (const level of ["error", "warn"]) {
  const orig = console[level];
  console[level] = (...args) => {
    errors.push(`console.${level}: ${args.map(String).join(" ")}`);
    orig(...args);
  };
}

const transport = new StreamableHTTPClientTransport(new URL(process.env.AMBER_MCP_URL), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.AMBER_TOKEN}` } },
});
transport.onerror = (e) => errors.push(`transport onerror: ${e?.stack || e}`);
const client = new Client({ name: "amber-mcp-e2e", version: "1.0.0" });
client.onerror = (e) => errors.push(`client onerror: ${e?.stack || e}`);

const step = (s) => console.log(`ok ${s}`);

async function tool(name, args, opts) {
  const res = await client.callTool({ name, arguments: args }, undefined, opts);
  if (res.isError) throw new Error(`${name}: ${JSON.stringify(res.content)}`);
  return res.structuredContent;
}

async function main() {
  await client.connect(transport);
  assert.ok(transport.sessionId, "initialize opened no MCP session");
  assert.equal(client.getServerCapabilities().logging, undefined, "logging is advertised but never sent");
  step(`initialize (session ${transport.sessionId.slice(0, 6)}…, protocol ${transport.protocolVersion})`);

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const want of ["sandbox_create", "exec", "write_file", "read_file", "process_start", "process_output", "checkpoint", "fork", "sandbox_destroy"]) {
    assert.ok(names.includes(want), `tool ${want} missing: ${names}`);
  }
  step(`tools/list (${names.length} tools)`);

  const { sandbox } = await tool("sandbox_create", { template: "minimal" });
  assert.match(sandbox, /^sbx-/);
  step(`sandbox_create ${sandbox}`);

  const progress = [];
  const onprogress = (p) => progress.push(p);
  const ex = await tool("exec", { sandbox, command: ["sh", "-c", "echo one; sleep 0.5; echo two"] }, { onprogress });
  assert.equal(ex.exit_code, 0);
  assert.equal(ex.stdout, "one\ntwo\n");
  const seen = progress.map((p) => p.message).join("|");
  assert.ok(seen.includes("one") && seen.includes("two") && seen.includes("exited with code 0"), `exec's progress: ${seen}`);
  for (let i = 1; i < progress.length; i++) assert.ok(progress[i].progress > progress[i - 1].progress, "progress must grow");
  step(`exec with ${progress.length} progress notifications`);

  const w = await tool("write_file", { sandbox, path: "/root/hello.txt", content: "héllo\n" });
  assert.equal(w.bytes, 7);
  const r = await tool("read_file", { sandbox, path: "/root/hello.txt" });
  assert.equal(r.content, "héllo\n");
  assert.equal(r.encoding, "utf-8");
  step("write_file, read_file");

  const { pid } = await tool("process_start", { sandbox, command: ["sh", "-c", "echo bg-out; sleep 600"] });
  let out = { stdout: "" };
  for (let i = 0; i < 100 && !out.stdout.includes("bg-out"); i++) {
    out = await tool("process_output", { sandbox, pid });
    if (!out.stdout.includes("bg-out")) await new Promise((ok) => setTimeout(ok, 50));
  }
  assert.ok(out.stdout.includes("bg-out") && out.running, `process_output: ${JSON.stringify(out)}`);
  step(`process_start (pid ${pid}), process_output`);

  progress.length = 0;
  const { checkpoint } = await tool("checkpoint", { sandbox }, { onprogress });
  const ckSeen = progress.map((p) => p.message).join("|");
  assert.ok(ckSeen.includes("started") && ckSeen.includes(`checkpoint ${checkpoint} taken`), `checkpoint's progress: ${ckSeen}`);
  const { checkpoints } = await tool("checkpoint_list", { sandbox });
  assert.ok(checkpoints.some((c) => c.id === checkpoint));
  const fork = (await tool("fork", { checkpoint })).sandbox;
  assert.notEqual(fork, sandbox);
  const fr = await tool("read_file", { sandbox: fork, path: "/root/hello.txt" });
  assert.equal(fr.content, "héllo\n");
  step(`checkpoint ${checkpoint} with progress, checkpoint_list, fork ${fork}`);

  // Cancel: abort the call once the command runs; the SDK sends
  // notifications/cancelled in a POST of its own.
  const ac = new AbortController();
  let started;
  const isStarted = new Promise((ok) => (started = ok));
  const running = tool("exec", { sandbox, command: ["sleep", "2718"] }, {
    signal: ac.signal,
    onprogress: (p) => p.message?.startsWith("started as pid") && started(),
  });
  await isStarted;
  let ps = await tool("exec", { sandbox, command: ["ps"] });
  assert.ok(ps.stdout.includes("sleep 2718"), `not running: ${ps.stdout}`);
  ac.abort("the agent changed its mind");
  await assert.rejects(running);
  for (let i = 0; ; i++) {
    ps = await tool("exec", { sandbox, command: ["ps"] });
    if (!ps.stdout.includes("sleep 2718")) break;
    assert.ok(i < 200, `the cancelled command still runs:\n${ps.stdout}`);
    await new Promise((ok) => setTimeout(ok, 50));
  }
  step("exec cancelled: its process is gone from ps");

  for (const id of [fork, sandbox]) assert.equal((await tool("sandbox_destroy", { sandbox: id })).done, true);
  step("sandbox_destroy");

  await transport.terminateSession();
  await client.close();
  step("session ended");
}

try {
  await main();
} catch (e) {
  errors.push(`failed: ${e?.stack || e}`);
}
if (errors.length) {
  console.log(`not ok: ${errors.length} error(s)\n${errors.join("\n")}`);
  process.exit(1);
}
console.log("all ok");
