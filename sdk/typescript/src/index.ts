/**
 * Amber's TypeScript SDK: a typed client of an Amber daemon's REST API
 * (sandboxes, streamed exec, files, checkpoints, agent sessions and their
 * event streams), with no runtime dependencies (Node 20's fetch and web
 * streams). The types come from api/openapi.json (src/openapi.ts, made by
 * `npm run generate`).
 */
export { Client, Execution } from "./client.js";
export type {
  APIKey,
  CallOptions,
  Checkpoint,
  ClientOptions,
  CreateOptions,
  CreateSandboxRequest,
  Effect,
  Event,
  EventList,
  ExecChunk,
  ExecFrame,
  ExecOptions,
  ExecResult,
  ExitStatus,
  FileInfo,
  FollowOptions,
  Info,
  OperationFrame,
  PostSessionEventRequest,
  Process,
  Progress,
  ProgressOptions,
  RequestSpec,
  Sandbox,
  Session,
  SessionDefinition,
  SessionStreamOptions,
  Stdin,
  Template,
  Tenant,
} from "./client.js";
export type { OutputChunk, OutputOptions, WatchEvent } from "./background.js";
export { AmberError, Kinds } from "./errors.js";
export { OPERATIONS } from "./operations.js";
export type { Method, OperationId, Schemas } from "./operations.js";
export type { components, operations, paths } from "./openapi.js";
export { lines, ndjson, sse } from "./streams.js";
export type { SSEMessage } from "./streams.js";
