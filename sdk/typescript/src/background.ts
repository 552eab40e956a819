// The streams of background processes and of file changes: a process's
// output read from a byte offset and re-attached to from the last byte
// seen when the stream breaks (the sandbox keeps the output, so this works
// across a dropped connection, a daemon restart, a checkpoint or a
// restore), and a directory's changes as they happen.

import { AmberError } from "./errors.js";
import type { Schemas } from "./operations.js";
import type { RequestSpec } from "./client.js";
import type { OperationId } from "./operations.js";
import { ndjson } from "./streams.js";

export type OutputFrameWire = Schemas["OutputFrame"];
export type WatchEvent = Schemas["WatchEvent"];

/** One piece of a process's output, or a marker. */
export interface OutputChunk {
  /** stdout, stderr, exited (exit set), rewound or lost. */
  stream: "stdout" | "stderr" | "exited" | "rewound" | "lost";
  /** The byte offset of data in the process's output (stdout and stderr counted together). */
  offset: number;
  data: Uint8Array;
  exit?: Schemas["ExitStatus"];
  lost?: number;
}

export interface OutputOptions {
  /** Start at this byte of the output (default 0). */
  offset?: number;
  /** Go on until the process ends; the last chunk is "exited" (default false). */
  follow?: boolean;
  /** With follow: open the stream again after a break, from the last byte yielded (default true). */
  reconnect?: boolean;
  signal?: AbortSignal;
}

type Requester = (op: OperationId, spec: RequestSpec) => Promise<Response>;

function fromBase64(s: string | undefined): Uint8Array {
  if (!s) return new Uint8Array();
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason);
    }, { once: true });
  });

/**
 * Yields process pid's output from o.offset on, each byte once: a stream
 * that breaks ("unavailable") is opened again from the offset after the
 * last byte yielded.
 */
export async function* processOutput(request: Requester, id: string, pid: number, o: OutputOptions = {}): AsyncGenerator<OutputChunk> {
  let offset = o.offset ?? 0;
  const follow = o.follow ?? false;
  for (let broke = 0; ; broke++) {
    try {
      const resp = await request("processOutput", {
        params: { id, pid },
        query: { offset, follow: follow || undefined },
        accept: "application/x-ndjson",
        signal: o.signal,
      });
      for await (const f of ndjson<OutputFrameWire>(resp.body!)) {
        if (f.stream === "error") {
          throw new AmberError(f.error?.kind ?? "unavailable", f.error?.message ?? "output stream failed", statusOf(f.error?.kind));
        }
        const c: OutputChunk = { stream: f.stream, offset: f.offset, data: fromBase64(f.data) };
        if (f.exit) c.exit = f.exit;
        if (f.lost) c.lost = f.lost;
        if (c.stream === "stdout" || c.stream === "stderr") {
          const end = c.offset + c.data.length;
          if (end <= offset) continue;
          if (c.offset < offset) {
            c.data = c.data.subarray(offset - c.offset);
            c.offset = offset;
          }
          offset = end;
        } else if (c.stream === "rewound" || c.stream === "lost") {
          offset = c.offset;
        }
        broke = 0;
        yield c;
        if (c.stream === "exited") return;
      }
      if (!follow) return;
    } catch (e) {
      if (o.signal?.aborted) throw e;
      const retry = follow && (o.reconnect ?? true) && e instanceof AmberError && e.kind === "unavailable" && broke < 30;
      if (!retry) throw e;
    }
    await sleep(Math.min(100 * (broke + 1), 2000), o.signal);
  }
}

/** Yields the changes under path as they happen, until the caller stops or o.signal aborts. */
export async function* watchFiles(request: Requester, id: string, path: string, o: { recursive?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent> {
  const resp = await request("watchFiles", {
    params: { id },
    query: { path, recursive: o.recursive || undefined },
    accept: "application/x-ndjson",
    signal: o.signal,
  });
  for await (const e of ndjson<WatchEvent & Schemas["Error"]>(resp.body!)) {
    if (e.error) throw new AmberError(e.error.kind, e.error.message, statusOf(e.error.kind));
    yield e;
  }
}

// The HTTP status of each error kind (the daemon's errdefs.HTTPStatus): an
// error that arrives inside a stream carries the status its kind has as a
// plain answer.
const STATUS: Record<string, number> = {
  "not found": 404, "already exists": 409, "invalid argument": 400, conflict: 409, fenced: 409, compacted: 410,
  unavailable: 503, "data loss": 500, "permission denied": 403, unauthenticated: 401, "resource exhausted": 429,
  "failed precondition": 412, "not implemented": 501, "too large": 413, internal: 500,
};

export function statusOf(kind: string | undefined): number | undefined {
  return kind === undefined ? undefined : STATUS[kind];
}
