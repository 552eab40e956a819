import { AmberError } from "./errors.js";
import { OPERATIONS, type OperationId, type Schemas } from "./operations.js";
import { ndjson, sse } from "./streams.js";
import { processOutput, statusOf, watchFiles, type OutputChunk, type OutputOptions, type WatchEvent } from "./background.js";

export type Sandbox = Schemas["Sandbox"];
export type CreateSandboxRequest = Schemas["CreateSandboxRequest"];
export type Template = Schemas["Template"];
export type Info = Schemas["Info"];
export type ExitStatus = Schemas["ExitStatus"];
export type ExecFrame = Schemas["ExecFrame"];
export type Process = Schemas["Process"];
export type FileInfo = Schemas["FileInfo"];
export type Event = Schemas["Event"];
export type EventList = Schemas["EventList"];
export type Checkpoint = Schemas["Checkpoint"];
export type Progress = Schemas["Progress"];
export type OperationFrame = Schemas["OperationFrame"];
export type Effect = Schemas["Effect"];
export type Tenant = Schemas["Tenant"];
export type APIKey = Schemas["APIKey"];
export type Session = Schemas["Session"];
export type SessionDefinition = Schemas["SessionDefinition"];
export type PostSessionEventRequest = Schemas["PostSessionEventRequest"];

/** Options of a Client. */
export interface ClientOptions {
  /**
   * The daemon: "host:port" or a URL (default $AMBER_ADDR, else
   * 127.0.0.1:7777).
   */
  addr?: string;
  /**
   * An API key (default $AMBER_TOKEN, else the operator's key in
   * DATA_DIR/admin.key, DATA_DIR being dataDir, $AMBER_DATA_DIR or
   * /var/lib/amber).
   */
  token?: string;
  dataDir?: string;
  /** The fetch to use (default the global one). */
  fetch?: typeof fetch;
}

/** Per-call options. */
export interface CallOptions {
  signal?: AbortSignal;
}

/**
 * Options of the creating calls. With idempotencyKey, a retry of the same
 * call (same body) returns the first answer and creates nothing; the same
 * key with another body is an "invalid argument" error.
 */
export interface CreateOptions extends CallOptions {
  idempotencyKey?: string;
}

/** One piece of a command's output. */
export interface ExecChunk {
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

/** How a command ended, with its whole output. */
export interface ExecResult {
  code: number;
  signal: string | undefined;
  timedOut: boolean;
  stdout: Uint8Array;
  stderr: Uint8Array;
  /** stdout decoded as UTF-8. */
  readonly text: string;
}

export type Stdin = string | Uint8Array | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>;

export interface ExecOptions extends CallOptions {
  env?: Record<string, string> | string[];
  cwd?: string;
  timeoutMs?: number;
  tty?: boolean;
  /**
   * The command's standard input. A string or bytes are sent whole (JSON
   * request). A ReadableStream or an async iterable is streamed as the
   * request body while the output streams back (HTTP/1.1 full duplex), so
   * a command can be fed as it runs; the command's stdin closes when the
   * stream ends.
   */
  stdin?: Stdin;
}

export interface ProgressOptions extends CreateOptions {
  /** Sees the phases (cut, upload, fetch, restore) and bytes as they go. */
  onProgress?: (p: Progress) => void;
}

/** Options of the followed streams (sandbox events, session events). */
export interface FollowOptions extends CallOptions {
  /**
   * Reconnect when the connection breaks or the daemon closes the stream
   * (a restart), resuming after the last event seen: nothing is missed,
   * nothing repeated (default true). Only "unavailable" answers (a daemon
   * refusing connections, 502, 503, 504) are retried; any other error of
   * the API ends the stream.
   */
  reconnect?: boolean;
  /** Consecutive failed connection attempts before giving up (default 10). */
  maxRetries?: number;
  /** Delay before the first reconnection, doubled each time up to 5 s (default 200 ms). */
  retryDelayMs?: number;
}

export interface SessionStreamOptions extends FollowOptions {
  /** Start after this sequence number (default 0: from the beginning). */
  after?: number;
  /**
   * Sees the live text deltas of model answers. They are not durable and
   * carry no sequence number; the complete message follows as an event.
   */
  onDelta?: (text: string) => void;
  /** Called before each reconnection with the Last-Event-ID it sends. */
  onReconnect?: (lastEventId: number, attempt: number) => void;
}

const enc = new TextEncoder();
const dec = new TextDecoder();

function toBase64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

function fromBase64(s: string | undefined): Uint8Array {
  if (!s) return new Uint8Array(0);
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function envList(env: Record<string, string> | string[] | undefined): string[] | undefined {
  if (!env) return undefined;
  return Array.isArray(env) ? env : Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

function toStream(stdin: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>): ReadableStream<Uint8Array> {
  if (stdin instanceof ReadableStream) return stdin;
  const it = stdin[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      const { value, done } = await it.next();
      if (done) c.close();
      else c.enqueue(typeof value === "string" ? enc.encode(value) : value);
    },
    async cancel(reason) {
      await it.return?.(reason);
    },
  });
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

type Query = Record<string, string | number | boolean | string[] | undefined>;

/** What listSandboxes selects by. */
export interface ListSandboxesOptions extends CallOptions {
  state?: string[];
  metadata?: Record<string, string>;
}

/** What request() sends: path parameters, query, a JSON or raw body, headers. */
export interface RequestSpec {
  params?: Record<string, string | number>;
  query?: Query;
  /** A JSON value, or raw bytes / a stream with contentType. */
  json?: unknown;
  raw?: Uint8Array | ReadableStream<Uint8Array>;
  contentType?: string;
  accept?: string;
  headers?: Record<string, string>;
  idempotencyKey?: string;
  signal?: AbortSignal | undefined;
}

/**
 * A client of one Amber daemon.
 *
 *     const amber = new Client({ addr: "127.0.0.1:7777", token });
 *     const sb = await amber.createSandbox({ template: "python" });
 *     const r = await amber.run(sb.id, ["python3", "-c", "print(6*7)"]);
 *     // r.code === 0, r.text === "42\n"
 *
 * Every failed call rejects with an AmberError carrying the API's error kind
 * and the HTTP status.
 */
export class Client {
  readonly baseURL: string;
  #token: string | undefined;
  #tokenLoaded: Promise<string | undefined> | undefined;
  #dataDir: string | undefined;
  #fetch: typeof fetch;

  constructor(opts: ClientOptions = {}) {
    const env = processEnv();
    let addr = opts.addr || env.AMBER_ADDR || "127.0.0.1:7777";
    if (!addr.includes("://")) addr = "http://" + addr;
    let u: URL;
    try {
      u = new URL(addr);
    } catch {
      throw new AmberError("invalid argument", `daemon address ${JSON.stringify(addr)} is not host:port or a URL`);
    }
    if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) {
      throw new AmberError("invalid argument", `daemon address ${JSON.stringify(addr)} is not an http(s) URL`);
    }
    this.baseURL = u.origin + u.pathname.replace(/\/+$/, "");
    this.#token = opts.token || env.AMBER_TOKEN || undefined;
    this.#dataDir = opts.dataDir;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // --- plumbing ----------------------------------------------------------

  async #authToken(): Promise<string | undefined> {
    if (this.#token) return this.#token;
    this.#tokenLoaded ??= readAdminKey(this.#dataDir);
    return this.#tokenLoaded;
  }

  /** The URL of an operation with its path parameters filled in. */
  #url(op: OperationId, params: Record<string, string | number> = {}, query?: Query): string {
    const [, tmpl] = OPERATIONS[op];
    const path = tmpl.replace(/\{(\w+)\}/g, (_, name: string) => {
      const v = params[name];
      if (v === undefined || v === "") throw new AmberError("invalid argument", `${op}: ${name} is required`);
      return encodeURIComponent(String(v));
    });
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v === undefined) continue;
      if (Array.isArray(v)) v.forEach((x) => qs.append(k, x));
      else qs.append(k, String(v));
    }
    const s = qs.toString();
    return this.baseURL + path + (s ? "?" + s : "");
  }

  /**
   * Sends one operation (by operationId, see OPERATIONS); resolves to its
   * 2xx response, else rejects with the API's error. The typed methods
   * use it; it is public for operations they do not cover.
   */
  async request(op: OperationId, spec: RequestSpec = {}): Promise<Response> {
    const [method] = OPERATIONS[op];
    const url = this.#url(op, spec.params, spec.query);
    const headers: Record<string, string> = { ...spec.headers };
    const token = await this.#authToken();
    if (token) headers["Authorization"] = "Bearer " + token;
    if (spec.accept) headers["Accept"] = spec.accept;
    if (spec.idempotencyKey) headers["Idempotency-Key"] = spec.idempotencyKey;
    let body: BodyInit | undefined;
    let duplex = false;
    if (spec.json !== undefined) {
      body = JSON.stringify(spec.json);
      headers["Content-Type"] = "application/json";
    } else if (spec.raw !== undefined) {
      headers["Content-Type"] = spec.contentType ?? "application/octet-stream";
      body = spec.raw as BodyInit;
      duplex = spec.raw instanceof ReadableStream;
    }
    const init: RequestInit & { duplex?: "half" } = { method: method.toUpperCase(), headers };
    if (body !== undefined) init.body = body;
    if (duplex) init.duplex = "half";
    if (spec.signal) init.signal = spec.signal;
    let resp: Response;
    try {
      resp = await this.#fetch(url, init);
    } catch (e) {
      if (spec.signal?.aborted) throw e;
      throw new AmberError("unavailable", `${init.method} ${url}: ${errText(e)} (is \`amber up\` running there?)`, undefined, { cause: e });
    }
    if (resp.ok) return resp;
    const raw = await resp.text().catch(() => "");
    let kind = "internal";
    let message = `${init.method} ${url}: HTTP ${resp.status}: ${raw.slice(0, 200)}`;
    try {
      const e = (JSON.parse(raw) as Schemas["Error"]).error;
      if (e && typeof e.kind === "string") {
        kind = e.kind;
        message = e.message;
      }
    } catch {
      // not the API's error body: keep the raw text
    }
    throw new AmberError(kind, message, resp.status);
  }

  async #json<T>(op: OperationId, spec: RequestSpec = {}): Promise<T> {
    const resp = await this.request(op, spec);
    const text = await resp.text();
    return (text.trim() ? JSON.parse(text) : undefined) as T;
  }

  async #none(op: OperationId, spec: RequestSpec = {}): Promise<void> {
    const resp = await this.request(op, spec);
    await resp.body?.cancel();
  }

  // --- daemon and templates -----------------------------------------------

  info(o: CallOptions = {}): Promise<Info> {
    return this.#json("info", { signal: o.signal });
  }

  async templates(o: CallOptions = {}): Promise<Template[]> {
    return (await this.#json<Schemas["TemplateList"]>("listTemplates", { signal: o.signal })).templates;
  }

  // --- sandboxes ------------------------------------------------------------

  /** Creates a sandbox and starts it (unless cold). */
  createSandbox(req: CreateSandboxRequest, o: CreateOptions = {}): Promise<Sandbox> {
    return this.#json("createSandbox", { json: req, idempotencyKey: o.idempotencyKey, signal: o.signal });
  }

  /**
   * Lists the caller's sandboxes: with `state`, only those in these states
   * (default: every state but destroyed); with `metadata`, only those whose
   * metadata hold every pair.
   */
  async listSandboxes(o: ListSandboxesOptions = {}): Promise<Sandbox[]> {
    const metadata = Object.entries(o.metadata ?? {}).map(([k, v]) => `${k}=${v}`);
    const query = { state: o.state?.length ? o.state : undefined, metadata: metadata.length ? metadata : undefined };
    return (await this.#json<Schemas["SandboxList"]>("listSandboxes", { query, signal: o.signal })).sandboxes;
  }

  /** Sets the sandbox's deadline to `seconds` from now (0 removes it). */
  setTimeout(id: string, seconds: number, o: CallOptions = {}): Promise<Sandbox> {
    return this.#json("setSandboxTimeout", { params: { id }, json: { timeout: seconds }, signal: o.signal });
  }

  getSandbox(id: string, o: CallOptions = {}): Promise<Sandbox> {
    return this.#json("getSandbox", { params: { id }, signal: o.signal });
  }

  /** Destroys a sandbox (its checkpoints stay until deleted). */
  destroySandbox(id: string, o: CallOptions = {}): Promise<void> {
    return this.#none("deleteSandbox", { params: { id }, signal: o.signal });
  }

  /** SIGKILLs every process of the sandbox: a crash, for testing recovery. */
  kill(id: string, o: CallOptions = {}): Promise<Sandbox> {
    return this.#json("killSandbox", { params: { id }, signal: o.signal });
  }

  // --- exec and processes -----------------------------------------------------

  /**
   * Runs a command in a sandbox and streams its output: iterate the
   * returned Execution for chunks as they arrive, or await its result().
   * The command is an argv run as is (["ls", "-la"]), or a string: a shell
   * command line run by the sandbox's /bin/sh -c ("ls -la | wc -l").
   */
  exec(id: string, command: string | string[], o: ExecOptions = {}): Execution {
    return new Execution(() => this.#startExec(id, command, o), o.signal);
  }

  /** Runs a command (an argv or a shell command line) to completion; resolves to its exit status and output. */
  run(id: string, command: string | string[], o: ExecOptions = {}): Promise<ExecResult> {
    return this.exec(id, command, o).result();
  }

  #startExec(id: string, command: string | string[], o: ExecOptions): Promise<Response> {
    const cmd = typeof command === "string" ? command : undefined;
    const args = typeof command === "string" ? [] : command;
    if (cmd === undefined && args.length === 0) throw new AmberError("invalid argument", "exec: args is empty");
    const streamed = o.stdin !== undefined && typeof o.stdin !== "string" && !(o.stdin instanceof Uint8Array);
    if (streamed) {
      return this.request("exec", {
        params: { id },
        query: { arg: args, cmd, env: envList(o.env), cwd: o.cwd, tty: o.tty || undefined, timeout_ms: o.timeoutMs },
        raw: toStream(o.stdin as ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>),
        accept: "application/x-ndjson",
        signal: o.signal,
      });
    }
    const req: Schemas["ExecRequest"] = cmd !== undefined ? { cmd } : { args };
    const env = envList(o.env);
    if (env) req.env = env;
    if (o.cwd) req.cwd = o.cwd;
    if (o.tty) req.tty = true;
    if (o.timeoutMs) req.timeout_ms = o.timeoutMs;
    if (o.stdin !== undefined) req.stdin = toBase64(typeof o.stdin === "string" ? enc.encode(o.stdin) : (o.stdin as Uint8Array));
    return this.request("exec", { params: { id }, json: req, accept: "application/x-ndjson", signal: o.signal });
  }

  /**
   * Starts a command (an argv or a shell command line, as exec) in the
   * background; resolves to its PID in the sandbox. With stdin: true its
   * stdin stays open for sendStdin; otherwise it reads end of file at once.
   */
  async start(id: string, command: string | string[], o: CreateOptions & { env?: Record<string, string> | string[]; cwd?: string; stdin?: boolean } = {}): Promise<number> {
    const req: Schemas["StartProcessRequest"] = typeof command === "string" ? { cmd: command } : { args: command };
    const env = envList(o.env);
    if (env) req.env = env;
    if (o.cwd) req.cwd = o.cwd;
    if (o.stdin) req.stdin = true;
    const r = await this.#json<Schemas["StartProcessResponse"]>("startProcess", {
      params: { id },
      json: req,
      idempotencyKey: o.idempotencyKey,
      signal: o.signal,
    });
    return r.pid;
  }

  async processes(id: string, o: CallOptions = {}): Promise<Process[]> {
    return (await this.#json<Schemas["ProcessList"]>("listProcesses", { params: { id }, signal: o.signal })).processes;
  }

  signal(id: string, pid: number, signal = "SIGTERM", o: CallOptions = {}): Promise<void> {
    return this.#none("signalProcess", { params: { id, pid }, json: { signal }, signal: o.signal });
  }

  /** Waits for a started process to end. */
  wait(id: string, pid: number, o: CallOptions = {}): Promise<ExitStatus> {
    return this.#json("waitProcess", { params: { id, pid }, signal: o.signal });
  }

  /**
   * Waits for a started process to end; resolves to its exit status and
   * its output (the output the sandbox keeps, its last 1 MiB).
   */
  async waitOutput(id: string, pid: number, o: CallOptions = {}): Promise<ExecResult> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    let x: ExitStatus = { code: 0 };
    for await (const c of this.output(id, pid, { follow: true, signal: o.signal })) {
      if (c.stream === "stdout") out.push(c.data);
      else if (c.stream === "stderr") err.push(c.data);
      else if (c.stream === "exited" && c.exit) x = c.exit;
    }
    const stdout = concat(out);
    return {
      code: x.code, signal: x.signal || undefined, timedOut: x.timed_out ?? false, stdout, stderr: concat(err),
      get text() {
        return dec.decode(stdout);
      },
    };
  }

  /**
   * A process's output from o.offset on (stdout and stderr in the order it
   * wrote them; kept in the sandbox, so it survives a daemon restart, a
   * checkpoint or a restore). With follow it goes on until the process
   * ends, re-attaching from the last byte yielded when the stream breaks.
   * Keep chunk.offset + chunk.data.length to re-attach later yourself.
   */
  output(id: string, pid: number, o: OutputOptions = {}): AsyncGenerator<OutputChunk> {
    return processOutput((op, spec) => this.request(op, spec), id, pid, o);
  }

  /** Sends data to the stdin of a process started with stdin: true; close closes its stdin after. */
  sendStdin(id: string, pid: number, data: string | Uint8Array, o: CallOptions & { close?: boolean } = {}): Promise<void> {
    return this.#none("writeProcessStdin", {
      params: { id, pid },
      query: { close: o.close || undefined },
      raw: typeof data === "string" ? enc.encode(data) : data,
      signal: o.signal,
    });
  }

  // --- files --------------------------------------------------------------------

  async readFile(id: string, path: string, o: CallOptions = {}): Promise<Uint8Array> {
    const resp = await this.request("getFile", { params: { id }, query: { path }, signal: o.signal });
    if ((resp.headers.get("Content-Type") ?? "").startsWith("application/json")) {
      // A directory's listing: file contents are always octet-stream.
      await resp.body?.cancel();
      throw new AmberError("invalid argument", `${path} in sandbox ${id} is a directory`);
    }
    return new Uint8Array(await resp.arrayBuffer());
  }

  async readText(id: string, path: string, o: CallOptions = {}): Promise<string> {
    return dec.decode(await this.readFile(id, path, o));
  }

  /** Writes a file (mode default 0o644), creating or replacing it. */
  writeFile(id: string, path: string, data: string | Uint8Array, o: CallOptions & { mode?: number } = {}): Promise<void> {
    return this.#none("putFile", {
      params: { id },
      query: { path, mode: (o.mode ?? 0o644).toString(8).padStart(4, "0") },
      raw: typeof data === "string" ? enc.encode(data) : data,
      signal: o.signal,
    });
  }

  async listDir(id: string, path: string, o: CallOptions = {}): Promise<FileInfo[]> {
    const resp = await this.request("getFile", { params: { id }, query: { path }, signal: o.signal });
    if (!(resp.headers.get("Content-Type") ?? "").startsWith("application/json")) {
      await resp.body?.cancel();
      throw new AmberError("invalid argument", `${path} in sandbox ${id} is not a directory`);
    }
    return ((await resp.json()) as Schemas["FileList"]).entries;
  }

  stat(id: string, path: string, o: CallOptions = {}): Promise<FileInfo> {
    return this.#json("getFile", { params: { id }, query: { path, stat: true }, signal: o.signal });
  }

  /** Whether path exists in the sandbox (a dangling symlink does). */
  async exists(id: string, path: string, o: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(id, path, o);
      return true;
    } catch (e) {
      if (e instanceof AmberError && e.kind === "not found") return false;
      throw e;
    }
  }

  /** The changes under path as they happen (recursive: below it too), until the caller stops or o.signal aborts. */
  watch(id: string, path: string, o: CallOptions & { recursive?: boolean } = {}): AsyncGenerator<WatchEvent> {
    return watchFiles((op, spec) => this.request(op, spec), id, path, o);
  }

  remove(id: string, path: string, o: CallOptions & { recursive?: boolean } = {}): Promise<void> {
    return this.#none("deleteFile", { params: { id }, query: { path, recursive: o.recursive ?? false }, signal: o.signal });
  }

  mkdir(id: string, path: string, o: CallOptions & { mode?: number } = {}): Promise<void> {
    return this.#none("mkdir", {
      params: { id },
      query: { path, mode: (o.mode ?? 0o755).toString(8).padStart(4, "0") },
      signal: o.signal,
    });
  }

  /** Renames from to to inside the sandbox, as rename(2): an existing file at to is replaced. */
  rename(id: string, from: string, to: string, o: CallOptions = {}): Promise<void> {
    return this.#none("renameFile", { params: { id }, json: { from, to }, signal: o.signal });
  }

  /** A tar archive of the tree at path, as a stream; its entries are named from path's last element ("dir/…"). */
  async getTar(id: string, path: string, o: CallOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.request("getTar", { params: { id }, query: { path }, signal: o.signal });
    if (!resp.body) throw new AmberError("internal", "getTar: empty answer");
    return resp.body;
  }

  /** Unpacks a tar archive (bytes or a stream) under path. */
  putTar(id: string, path: string, tar: Uint8Array | ReadableStream<Uint8Array>, o: CallOptions = {}): Promise<void> {
    return this.#none("putTar", { params: { id }, query: { path }, raw: tar, contentType: "application/x-tar", signal: o.signal });
  }

  // --- checkpoints --------------------------------------------------------------

  async #operation<T>(op: OperationId, id: string, body: object, o: ProgressOptions): Promise<T> {
    const resp = await this.request(op, {
      params: { id },
      json: body,
      accept: "application/x-ndjson",
      idempotencyKey: o.idempotencyKey,
      signal: o.signal,
    });
    for await (const f of ndjson<OperationFrame>(resp.body!)) {
      if (f.error) throw new AmberError(f.error.kind, f.error.message, statusOf(f.error.kind));
      if (f.progress) {
        o.onProgress?.(f.progress);
        continue;
      }
      const out = f.checkpoint ?? f.sandbox;
      if (out) return out as T;
    }
    throw new AmberError("unavailable", `${op} ${id}: the answer broke off before its result`);
  }

  /**
   * Cuts a checkpoint and commits it: resolves once its chunks, then its
   * manifest, then the pointer that makes it visible are durable. With
   * stop, the sandbox is stopped after the cut.
   */
  checkpoint(id: string, o: ProgressOptions & { tag?: string; stop?: boolean } = {}): Promise<Checkpoint> {
    const body: Schemas["CreateCheckpointRequest"] = {};
    if (o.tag) body.tag = o.tag;
    if (o.stop) body.stop = true;
    return this.#operation("createCheckpoint", id, body, o);
  }

  /** A sandbox's checkpoints (with all, also failed and deleted ones). */
  async checkpoints(id: string, o: CallOptions & { all?: boolean } = {}): Promise<Checkpoint[]> {
    const r = await this.#json<Schemas["CheckpointList"]>("listCheckpoints", {
      params: { id },
      query: { all: o.all ? true : undefined },
      signal: o.signal,
    });
    return r.checkpoints;
  }

  getCheckpoint(checkpointId: string, o: CallOptions = {}): Promise<Checkpoint> {
    return this.#json("getCheckpoint", { params: { id: checkpointId }, signal: o.signal });
  }

  deleteCheckpoint(checkpointId: string, o: CallOptions = {}): Promise<void> {
    return this.#none("deleteCheckpoint", { params: { id: checkpointId }, signal: o.signal });
  }

  /**
   * Restores a checkpoint: in place into its sandbox, or (asNew) as a new
   * sandbox, a fork. Resolves to the running sandbox.
   */
  restore(checkpointId: string, o: ProgressOptions & { asNew?: boolean } = {}): Promise<Sandbox> {
    return this.#operation("restoreCheckpoint", checkpointId, o.asNew ? { as_new: true } : {}, o);
  }

  /**
   * Restores a sandbox in place from its latest committed checkpoint, or
   * from the newest one cut at or before its event toEvent.
   */
  recover(id: string, o: ProgressOptions & { toEvent?: number } = {}): Promise<Sandbox> {
    return this.#operation("recoverSandbox", id, o.toEvent ? { to_event: o.toEvent } : {}, o);
  }

  // --- events and effects -----------------------------------------------------

  /** A sandbox's events from position from (default 1). */
  events(id: string, o: CallOptions & { from?: number; limit?: number } = {}): Promise<EventList> {
    return this.#json("listEvents", { params: { id }, query: { from: o.from ?? 1, limit: o.limit }, signal: o.signal });
  }

  /**
   * Yields a sandbox's events from position from (default 1) as they
   * happen, until the caller stops iterating or aborts. Reconnects after
   * a break, from the event after the last one seen.
   */
  async *followEvents(id: string, o: FollowOptions & { from?: number; onReconnect?: (next: number, attempt: number) => void } = {}): AsyncGenerator<Event> {
    let next = o.from ?? 1;
    const onRetry = (attempt: number) => o.onReconnect?.(next, attempt);
    yield* this.#follow(o, async (signal) => {
      const resp = await this.request("listEvents", {
        params: { id },
        query: { from: next, follow: true },
        accept: "application/x-ndjson",
        signal,
      });
      return (async function* () {
        for await (const f of ndjson<Event & Schemas["Error"]>(resp.body!)) {
          if (f.error) throw new AmberError(f.error.kind, f.error.message, statusOf(f.error.kind));
          if (f.seq < next) continue; // never twice
          next = f.seq + 1;
          yield f as Event;
        }
      })();
    }, onRetry);
  }

  /** The outbound requests of a sandbox's egress journal. */
  async effects(id: string, o: CallOptions = {}): Promise<Effect[]> {
    return (await this.#json<Schemas["EffectList"]>("listEffects", { params: { id }, signal: o.signal })).effects;
  }

  /**
   * Runs connect (a stream of items) until the caller stops, reconnecting
   * after a break with backoff (FollowOptions). The API's errors other than
   * "unavailable", in the answer or inside the stream, end it.
   */
  async *#follow<T>(o: FollowOptions, connect: (signal: AbortSignal) => Promise<AsyncGenerator<T>>, onRetry?: (attempt: number) => void): AsyncGenerator<T> {
    const reconnect = o.reconnect ?? true;
    const maxRetries = o.maxRetries ?? 10;
    let delay = o.retryDelayMs ?? 200;
    let failures = 0;
    const ac = new AbortController();
    const onAbort = () => ac.abort(o.signal?.reason);
    if (o.signal?.aborted) onAbort();
    else o.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for (;;) {
        try {
          const items = await connect(ac.signal);
          for await (const item of items) {
            failures = 0;
            delay = o.retryDelayMs ?? 200;
            yield item;
          }
        } catch (e) {
          if (ac.signal.aborted) throw o.signal?.aborted ? o.signal.reason : e;
          // A daemon that is restarting (refused, 502/503/504) is worth
          // another try; any other answer of the API is final.
          if (e instanceof AmberError && !(e.kind === "unavailable" || e.status === 502 || e.status === 503 || e.status === 504)) throw e;
          if (!reconnect || ++failures > maxRetries) {
            throw e instanceof AmberError ? e : new AmberError("unavailable", `stream broke: ${errText(e)}`, undefined, { cause: e });
          }
        }
        if (!reconnect) return;
        await sleep(delay, ac.signal);
        delay = Math.min(delay * 2, 5000);
        onRetry?.(failures);
      }
    } finally {
      o.signal?.removeEventListener("abort", onAbort);
      ac.abort();
    }
  }

  // --- tenants and keys ------------------------------------------------------------

  /** Creates a tenant (the operator's key). */
  createTenant(id: string, o: CallOptions & { name?: string } = {}): Promise<Tenant> {
    return this.#json("createTenant", { json: o.name ? { id, name: o.name } : { id }, signal: o.signal });
  }

  async tenants(o: CallOptions = {}): Promise<Tenant[]> {
    return (await this.#json<Schemas["TenantList"]>("listTenants", { signal: o.signal })).tenants;
  }

  /** Creates an API key of tenant; its secret (key) is in this answer only. */
  createKey(tenant: string, name: string, o: CallOptions & { scopes?: APIKey["scopes"]; expiresAt?: string } = {}): Promise<APIKey> {
    const req: Schemas["CreateKeyRequest"] = { name, scopes: o.scopes ?? ["read", "write"] };
    if (o.expiresAt) req.expires_at = o.expiresAt;
    return this.#json("createKey", { params: { tenant }, json: req, signal: o.signal });
  }

  async keys(tenant: string, o: CallOptions = {}): Promise<APIKey[]> {
    return (await this.#json<Schemas["APIKeyList"]>("listKeys", { params: { tenant }, signal: o.signal })).keys;
  }

  revokeKey(tenant: string, name: string, o: CallOptions = {}): Promise<void> {
    return this.#none("revokeKey", { params: { tenant, name }, signal: o.signal });
  }

  // --- agent sessions ------------------------------------------------------------------

  /** Creates an agent session from its definition. */
  createSession(def: SessionDefinition, o: CallOptions = {}): Promise<Session> {
    return this.#json("createSession", { json: def, signal: o.signal });
  }

  async listSessions(o: CallOptions = {}): Promise<Session[]> {
    return (await this.#json<Schemas["SessionList"]>("listSessions", { signal: o.signal })).sessions;
  }

  getSession(id: string, o: CallOptions = {}): Promise<Session> {
    return this.#json("getSession", { params: { id }, signal: o.signal });
  }

  /**
   * Appends a client event to a session ("user_message", "interrupt",
   * "tool_confirmation", ...; the "session." prefix is optional). With
   * eventId the post is idempotent: a retry with the same id is appended
   * once.
   */
  postSessionEvent(id: string, type: string, payload?: Record<string, unknown>, o: CallOptions & { eventId?: string } = {}): Promise<Event> {
    const req: PostSessionEventRequest = { type };
    if (payload) req.payload = payload;
    if (o.eventId) req.id = o.eventId;
    return this.#json("postSessionEvent", { params: { id }, json: req, signal: o.signal });
  }

  /** Sends the user's message to a session. */
  send(id: string, text: string, o: CallOptions & { eventId?: string } = {}): Promise<Event> {
    return this.postSessionEvent(id, "user_message", { text }, o);
  }

  /** A session's events after sequence number after (default 0). */
  sessionEvents(id: string, o: CallOptions & { after?: number; limit?: number } = {}): Promise<EventList> {
    return this.#json("listSessionEvents", { params: { id }, query: { after: o.after ?? 0, limit: o.limit }, signal: o.signal });
  }

  /**
   * Yields a session's events after sequence number after (default 0) as
   * they are appended, over Server-Sent Events, until the caller stops
   * iterating or aborts. After a disconnect it reconnects with the
   * Last-Event-ID of the last event seen, so nothing is missed and nothing
   * repeated (also across a daemon restart: the log is the source).
   */
  async *streamSessionEvents(id: string, o: SessionStreamOptions = {}): AsyncGenerator<Event> {
    let last = o.after ?? 0;
    let connected = false;
    yield* this.#follow(
      o,
      async (signal) => {
        const resp = await this.request("streamSessionEvents", {
          params: { id },
          query: connected ? undefined : { after: last },
          headers: connected ? { "Last-Event-ID": String(last) } : {},
          accept: "text/event-stream",
          signal,
        });
        connected = true;
        return (async function* () {
          for await (const m of sse(resp.body!)) {
            if (m.event === "error") {
              const e = (JSON.parse(m.data) as Schemas["Error"]).error;
              throw new AmberError(e?.kind ?? "internal", e?.message ?? m.data, statusOf(e?.kind ?? "internal"));
            }
            if (m.id === undefined) {
              if (m.event === "session.assistant_delta") o.onDelta?.((JSON.parse(m.data) as { text: string }).text);
              continue;
            }
            const ev = JSON.parse(m.data) as Event;
            if (ev.seq <= last) continue; // never twice, whatever the server sends
            last = ev.seq;
            yield ev;
          }
        })();
      },
      (attempt) => o.onReconnect?.(last, attempt),
    );
  }
}

/**
 * The output of a running command. Iterate it for chunks as they arrive
 * (each is also kept for result()), or await result() for all of it.
 * Iterating twice, or after result(), yields nothing more; breaking out of
 * the iteration closes the stream (the command's exit is then unknown).
 */
export class Execution implements AsyncIterable<ExecChunk> {
  #start: () => Promise<Response>;
  #signal: AbortSignal | undefined;
  #frames: AsyncGenerator<ExecFrame> | undefined;
  #out: Uint8Array[] = [];
  #err: Uint8Array[] = [];
  #exit: ExitStatus | undefined;
  #done = false;

  constructor(start: () => Promise<Response>, signal?: AbortSignal) {
    this.#start = start;
    this.#signal = signal;
  }

  /** How the command ended; undefined until the stream has been read to its end. */
  get exit(): ExitStatus | undefined {
    return this.#exit;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ExecChunk> {
    if (this.#done) return;
    if (!this.#frames) {
      const resp = await this.#start();
      this.#frames = ndjson<ExecFrame>(resp.body!);
    }
    for await (const f of this.#frames) {
      if (f.error) {
        this.#done = true;
        throw new AmberError(f.error.kind, f.error.message, statusOf(f.error.kind));
      }
      if (f.exit) {
        this.#exit = f.exit;
        this.#done = true;
        return;
      }
      if (!f.stream) continue; // the {"pid":…} frame
      const chunk: ExecChunk = { stream: f.stream === "stderr" ? "stderr" : "stdout", data: fromBase64(f.data) };
      (chunk.stream === "stdout" ? this.#out : this.#err).push(chunk.data);
      yield chunk;
    }
    this.#done = true;
    if (this.#signal?.aborted) throw this.#signal.reason;
    throw new AmberError("unavailable", "exec: the output stream broke before the exit status");
  }

  /** Reads the rest of the output; resolves to the exit status and all output. */
  async result(): Promise<ExecResult> {
    for await (const _ of this) {
      // collected by the iterator
    }
    const x = this.#exit!;
    const stdout = concat(this.#out);
    return {
      code: x.code,
      signal: x.signal || undefined,
      timedOut: x.timed_out ?? false,
      stdout,
      stderr: concat(this.#err),
      get text() {
        return dec.decode(stdout);
      },
    };
  }
}

function errText(e: unknown): string {
  if (e instanceof Error) {
    const c = (e as { cause?: unknown }).cause;
    return c instanceof Error ? `${e.message}: ${c.message}` : e.message;
  }
  return String(e);
}

function processEnv(): Record<string, string | undefined> {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env ?? {};
}

/** The operator's key in DATA_DIR/admin.key, when readable (Node only). */
async function readAdminKey(dataDir: string | undefined): Promise<string | undefined> {
  if (!(globalThis as { process?: unknown }).process) return undefined;
  const dir = dataDir || processEnv().AMBER_DATA_DIR || "/var/lib/amber";
  try {
    const fs = (await import("node:fs/promises" as string)) as { readFile(p: string, enc: string): Promise<string> };
    return (await fs.readFile(dir.replace(/\/+$/, "") + "/admin.key", "utf8")).trim() || undefined;
  } catch {
    return undefined;
  }
}
