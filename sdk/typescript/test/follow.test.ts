// The reconnection rules of the followed streams, against a scripted HTTP
// server on loopback (no daemon): a daemon that answers 503 while it
// starts is tried again, a stream the server closes is resumed with
// Last-Event-ID, an event the server repeats is not yielded twice, any other
// API error ends the stream, and a signal aborted beforehand stops it at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { AmberError, Client } from "../src/index.js";

type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

async function serve(answers: Handler[]): Promise<{ client: Client; requests: http.IncomingHttpHeaders[]; close: () => Promise<void> }> {
  const requests: http.IncomingHttpHeaders[] = [];
  const server = http.createServer((req, res) => {
    requests.push({ ...req.headers, ":path": req.url });
    const h = answers[requests.length - 1];
    if (h) h(req, res);
    else res.writeHead(500).end("no more answers scripted");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    client: new Client({ addr: `127.0.0.1:${port}`, token: "t" }),
    requests,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

const event = (seq: number, type = "session.x") =>
  `id: ${seq}\nevent: ${type}\ndata: ${JSON.stringify({ seq, id: `e${seq}`, type, version: 1, payload: {} })}\n\n`;
const sseHead = { "Content-Type": "text/event-stream" };

test("503, a closed stream and a repeated event: resumed with Last-Event-ID, each event once", async () => {
  const s = await serve([
    (_, res) => res.writeHead(503, { "Content-Type": "application/json" }).end('{"error":{"kind":"unavailable","message":"starting"}}'),
    (_, res) => res.writeHead(200, sseHead).end(event(1) + ": comment\n\n" + event(2)),
    (_, res) => res.writeHead(200, sseHead).end(event(2) + "event: session.assistant_delta\ndata: {\"text\":\"hi\"}\n\n" + event(3)),
  ]);
  try {
    const got: number[] = [];
    const deltas: string[] = [];
    const reconnects: number[] = [];
    for await (const ev of s.client.streamSessionEvents("ses-1", {
      retryDelayMs: 1,
      onDelta: (t) => deltas.push(t),
      onReconnect: (last) => reconnects.push(last),
    })) {
      got.push(ev.seq);
      if (ev.seq === 3) break;
    }
    assert.deepEqual(got, [1, 2, 3]);
    assert.deepEqual(deltas, ["hi"]);
    assert.deepEqual(reconnects, [0, 2]);
    assert.equal(s.requests[0]![":path"], "/v1/sessions/ses-1/events/stream?after=0");
    assert.equal(s.requests[0]!["last-event-id"], undefined);
    // The 503 was no connection: the retry asks again from the start.
    assert.equal(s.requests[1]![":path"], "/v1/sessions/ses-1/events/stream?after=0");
    assert.equal(s.requests[1]!["last-event-id"], undefined);
    assert.equal(s.requests[2]!["last-event-id"], "2");
    assert.equal(s.requests[2]!["authorization"], "Bearer t");
  } finally {
    await s.close();
  }
});

test("an API error ends the stream; an error event in it too", async () => {
  const s = await serve([
    (_, res) => res.writeHead(403, { "Content-Type": "application/json" }).end('{"error":{"kind":"permission denied","message":"no"}}'),
    (_, res) => res.writeHead(200, sseHead).end(event(1) + 'event: error\ndata: {"error":{"kind":"data loss","message":"bad record"}}\n\n'),
  ]);
  try {
    await assert.rejects(s.client.streamSessionEvents("ses-1", { retryDelayMs: 1 }).next(), (e: AmberError) => e.status === 403 && e.kind === "permission denied");
    const got: number[] = [];
    await assert.rejects(
      (async () => {
        for await (const ev of s.client.streamSessionEvents("ses-1", { retryDelayMs: 1 })) got.push(ev.seq);
      })(),
      (e: AmberError) => e.kind === "data loss" && e.message === "bad record",
    );
    assert.deepEqual(got, [1]);
    assert.equal(s.requests.length, 2);
  } finally {
    await s.close();
  }
});

test("without reconnect, or after maxRetries, a broken stream ends", async () => {
  const s = await serve([(_, res) => res.writeHead(200, sseHead).end(event(1))]);
  try {
    const got: number[] = [];
    for await (const ev of s.client.streamSessionEvents("ses-1", { reconnect: false })) got.push(ev.seq);
    assert.deepEqual(got, [1]);
    assert.equal(s.requests.length, 1);
  } finally {
    await s.close();
  }
  const gone = new Client({ addr: "127.0.0.1:1", token: "t" });
  await assert.rejects(gone.followEvents("sbx-1", { retryDelayMs: 1, maxRetries: 2 }).next(), (e: AmberError) => e.kind === "unavailable");
});

test("a signal aborted beforehand stops a stream before it connects", async () => {
  const s = await serve([]);
  try {
    const why = new Error("not wanted");
    await assert.rejects(s.client.streamSessionEvents("ses-1", { signal: AbortSignal.abort(why) }).next(), (e) => e === why);
    assert.equal(s.requests.length, 0);
  } finally {
    await s.close();
  }
});
