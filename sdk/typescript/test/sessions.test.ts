// Agent sessions with the scripted model adapter, and their event stream
// (Server-Sent Events): the SDK reconnects after a cut connection with
// Last-Event-ID and the events it yields are exactly the log, each once.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AmberError, Client, type Event, type Session } from "../src/index.js";
import { CuttableProxy } from "./proxy.js";
import { operator, skipLive } from "./env.js";

const SCRIPT = [{ tool_calls: [{ name: "bash", input: { command: "echo from-the-agent" } }] }, { text: "done" }];

const isDone = (seen: Event[]) => {
  const last = seen[seen.length - 1];
  return (
    last?.type === "session.status" &&
    (last.payload as { status?: string }).status === "idle" &&
    seen.some((e) => e.type === "session.assistant_message" && (e.payload as { text?: string }).text === "done")
  );
};

describe("sessions", { skip: skipLive }, () => {
  const c = operator();
  let proxy: CuttableProxy | undefined;
  let se: Session | undefined;

  after(async () => {
    await proxy?.close();
    if (se) {
      const sb = (await c.getSession(se.id).catch(() => undefined))?.sandbox;
      if (sb) await c.destroySandbox(sb).catch(() => {});
    }
  });

  test("a scripted session's events stream live and resume after a cut connection", async () => {
    se = await c.createSession({ model: { adapter: "scripted", script: SCRIPT }, template: "minimal", policy: "strict" });
    assert.match(se.id, /\S/);
    assert.equal(se.definition.model.adapter, "scripted");
    assert.ok((await c.listSessions()).some((s) => s.id === se!.id));

    proxy = await CuttableProxy.start(process.env.AMBER_ADDR!);
    const viaProxy = new Client({ addr: proxy.addr, token: process.env.AMBER_TOKEN! });
    const reconnects: { lastId: number; lastSeen: number | undefined }[] = [];
    const seen: Event[] = [];
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new Error("the session did not finish in 180 s")), 180_000);
    let cut = false;
    try {
      for await (const ev of viaProxy.streamSessionEvents(se.id, {
        signal: ac.signal,
        retryDelayMs: 50,
        onReconnect: (lastId) => reconnects.push({ lastId, lastSeen: seen[seen.length - 1]?.seq }),
      })) {
        seen.push(ev);
        if (!cut) {
          // Break the connection after the first event, then make the
          // session work: its events are appended while the client is
          // away and reconnecting.
          cut = true;
          proxy.cut();
          const a = await c.send(se.id, "go", { eventId: "ts-1" });
          const b = await c.send(se.id, "go", { eventId: "ts-1" }); // a retry: appended once
          assert.equal(b.seq, a.seq);
          assert.equal(b.id, a.id);
        }
        if (isDone(seen)) break;
      }
    } finally {
      clearTimeout(timer);
    }

    assert.ok(reconnects.length >= 1, "the SDK never reconnected");
    // Each reconnection resumed after the last event yielded before it.
    for (const r of reconnects) assert.equal(r.lastId, r.lastSeen, JSON.stringify(reconnects));
    assert.ok(proxy.connections >= 2);
    const resumed = proxy.heads.slice(1).find((h) => /^last-event-id:/im.test(h));
    assert.ok(resumed, `no reconnection carried Last-Event-ID: ${JSON.stringify(proxy.heads)}`);
    assert.match(resumed, new RegExp(`^last-event-id: ${reconnects[0]!.lastId}$`, "im"));

    // Exactly the log: every sequence number once, in order, none missing.
    const seqs = seen.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1), `seqs ${JSON.stringify(seqs)}`);
    const listed = (await c.sessionEvents(se.id)).events;
    assert.deepEqual(
      listed.slice(0, seen.length).map((e) => [e.seq, e.id]),
      seen.map((e) => [e.seq, e.id]),
    );
    const types = seen.map((e) => e.type);
    assert.equal(types.filter((t) => t === "session.user_message").length, 1);
    const result = seen.find((e) => e.type === "session.tool_result");
    assert.ok(result, JSON.stringify(types));
    assert.match(String((result.payload as { output?: string }).output), /from-the-agent/);
  });

  test("resume from a sequence number; live deltas; another turn", async () => {
    assert.ok(se, "needs the session of the test before");
    const all = (await c.sessionEvents(se.id)).events;
    const last = all[all.length - 1]!.seq;
    const mid = all[Math.floor(all.length / 2)]!.seq;

    // Resuming from the middle gives exactly the events after it.
    const again: number[] = [];
    for await (const ev of c.streamSessionEvents(se.id, { after: mid })) {
      again.push(ev.seq);
      if (ev.seq === last) break;
    }
    assert.deepEqual(again, all.filter((e) => e.seq > mid).map((e) => e.seq));

    // Live text deltas come to a connected client (the first event proves
    // the stream is established before the turn starts).
    // The stream ends when both the turn's end (idle) and its delta have
    // come, in whichever order; if the delta never comes, the timeout fails.
    const deltas: string[] = [];
    const next: Event[] = [];
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new Error(`no delta and idle within 120 s: ${JSON.stringify(deltas)}`)), 120_000);
    let idle = false;
    const finished = new Error("finished");
    try {
      for await (const ev of c.streamSessionEvents(se.id, {
        after: last - 1,
        signal: ac.signal,
        onDelta: (t) => {
          deltas.push(t);
          if (idle) ac.abort(finished);
        },
      })) {
        next.push(ev);
        if (next.length === 1) await c.send(se.id, "and now?");
        idle = next.length > 1 && ev.type === "session.status" && (ev.payload as { status?: string }).status === "idle";
        if (idle && deltas.length > 0) break;
      }
    } catch (e) {
      if (e !== finished) throw e;
    } finally {
      clearTimeout(timer);
    }
    assert.equal(next[0]!.seq, last);
    const answer = next.find((e) => e.type === "session.assistant_message");
    assert.equal((answer?.payload as { text?: string }).text, "(end of script)");
    assert.deepEqual(deltas, ["(end of script)"]);
    const got = await c.getSession(se.id);
    assert.equal(got.id, se.id);
  });

  test("session errors", async () => {
    await assert.rejects(c.getSession("ses-doesnotexist"), (e: AmberError) => e.status === 404 && e.kind === "not found");
    await assert.rejects(c.createSession({ model: { adapter: "nope" as "scripted" } }), (e: AmberError) => e.status === 400 && e.kind === "invalid argument");
    const stream = c.streamSessionEvents("ses-doesnotexist");
    await assert.rejects(stream.next(), (e: AmberError) => e.status === 404);
  });
});
