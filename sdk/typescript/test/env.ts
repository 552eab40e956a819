// What the tests need from outside: a running daemon (AMBER_ADDR and the
// operator's key in AMBER_TOKEN; cmd/amber's TestE2ETypeScriptSDK starts
// one and runs these tests, and `make test` runs that) and the OpenAPI
// document (AMBER_OPENAPI, default ../../api/openapi.json from the package).
// Without a daemon the live tests are skipped: the Go test fails when any is.
import { fileURLToPath } from "node:url";
import path from "node:path";
import { Client } from "../src/index.js";

export const live = Boolean(process.env.AMBER_ADDR && process.env.AMBER_TOKEN);
export const skipLive = live ? false : "set AMBER_ADDR and AMBER_TOKEN to a running daemon";

/** The package's root (tests run from build-test/test/). */
export const pkgRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export const openapiPath = process.env.AMBER_OPENAPI || path.resolve(pkgRoot, "../../api/openapi.json");

/** A client with the operator's key. */
export function operator(): Client {
  return new Client({ addr: process.env.AMBER_ADDR!, token: process.env.AMBER_TOKEN! });
}

export const text = (b: Uint8Array) => new TextDecoder().decode(b);

/** A name unique to this run, for tenants and idempotency keys. */
export function unique(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}`;
}

/** Polls check until it returns a value (not undefined) or ms pass. */
export async function eventually<T>(what: string, ms: number, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
