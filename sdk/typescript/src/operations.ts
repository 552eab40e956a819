// The API operations this SDK calls, by their OpenAPI operationId. The
// generated types (openapi.ts, from api/openapi.json) check at compile time
// that each path exists with that method and is that operation; the tests
// (test/openapi.test.ts) check the same against the document at run time and
// that openapi.ts is what the document generates today. Together they fail
// when the document and the SDK drift apart.

import type { components, operations, paths } from "./openapi.js";

export type Method = "get" | "post" | "put" | "delete";

export const OPERATIONS = {
  info: ["get", "/v1/info"],
  listTemplates: ["get", "/v1/templates"],
  createSandbox: ["post", "/v1/sandboxes"],
  listSandboxes: ["get", "/v1/sandboxes"],
  getSandbox: ["get", "/v1/sandboxes/{id}"],
  deleteSandbox: ["delete", "/v1/sandboxes/{id}"],
  killSandbox: ["post", "/v1/sandboxes/{id}/kill"],
  setSandboxTimeout: ["post", "/v1/sandboxes/{id}/timeout"],
  exec: ["post", "/v1/sandboxes/{id}/exec"],
  listProcesses: ["get", "/v1/sandboxes/{id}/processes"],
  startProcess: ["post", "/v1/sandboxes/{id}/processes"],
  signalProcess: ["post", "/v1/sandboxes/{id}/processes/{pid}/signal"],
  waitProcess: ["post", "/v1/sandboxes/{id}/processes/{pid}/wait"],
  writeProcessStdin: ["post", "/v1/sandboxes/{id}/processes/{pid}/stdin"],
  processOutput: ["get", "/v1/sandboxes/{id}/processes/{pid}/output"],
  getFile: ["get", "/v1/sandboxes/{id}/files"],
  putFile: ["put", "/v1/sandboxes/{id}/files"],
  deleteFile: ["delete", "/v1/sandboxes/{id}/files"],
  mkdir: ["post", "/v1/sandboxes/{id}/files/mkdir"],
  renameFile: ["post", "/v1/sandboxes/{id}/files/rename"],
  watchFiles: ["get", "/v1/sandboxes/{id}/files/watch"],
  getTar: ["get", "/v1/sandboxes/{id}/files/tar"],
  putTar: ["put", "/v1/sandboxes/{id}/files/tar"],
  listEvents: ["get", "/v1/sandboxes/{id}/events"],
  listEffects: ["get", "/v1/sandboxes/{id}/effects"],
  createCheckpoint: ["post", "/v1/sandboxes/{id}/checkpoints"],
  listCheckpoints: ["get", "/v1/sandboxes/{id}/checkpoints"],
  recoverSandbox: ["post", "/v1/sandboxes/{id}/recover"],
  getCheckpoint: ["get", "/v1/checkpoints/{id}"],
  deleteCheckpoint: ["delete", "/v1/checkpoints/{id}"],
  restoreCheckpoint: ["post", "/v1/checkpoints/{id}/restore"],
  createTenant: ["post", "/v1/tenants"],
  listTenants: ["get", "/v1/tenants"],
  createKey: ["post", "/v1/tenants/{tenant}/keys"],
  listKeys: ["get", "/v1/tenants/{tenant}/keys"],
  revokeKey: ["delete", "/v1/tenants/{tenant}/keys/{name}"],
  createSession: ["post", "/v1/sessions"],
  listSessions: ["get", "/v1/sessions"],
  getSession: ["get", "/v1/sessions/{id}"],
  postSessionEvent: ["post", "/v1/sessions/{id}/events"],
  listSessionEvents: ["get", "/v1/sessions/{id}/events"],
  streamSessionEvents: ["get", "/v1/sessions/{id}/events/stream"],
} as const satisfies Record<string, readonly [Method, keyof paths]>;

export type OperationId = keyof typeof OPERATIONS;

// Compile-time drift check: every entry names an operationId of the
// document, and its path and method lead to that very operation.
type Entry<K extends OperationId> = (typeof OPERATIONS)[K];
type Resolves<K extends OperationId> = K extends keyof operations
  ? [NonNullable<paths[Entry<K>[1]][Entry<K>[0]]>] extends [operations[K]]
    ? true
    : false
  : false;
type AllResolve = { [K in OperationId]: Resolves<K> };
const allResolve: { [K in OperationId]: true } = null as unknown as AllResolve;
void allResolve;

/** The API's schemas (components/schemas of api/openapi.json). */
export type Schemas = components["schemas"];
