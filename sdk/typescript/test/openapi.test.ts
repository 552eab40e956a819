// The SDK against the OpenAPI document: src/openapi.ts is what
// openapi-typescript makes of api/openapi.json today (run `npm run
// generate` after changing the document; tsc then fails wherever the SDK
// uses what changed), every operation the SDK calls is in the document with
// that method and operationId, and a running daemon serves that document.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { OPERATIONS, sse } from "../src/index.js";
import { live, openapiPath, operator, pkgRoot } from "./env.js";

interface Doc {
  paths: Record<string, Record<string, { operationId?: string }>>;
  components: { schemas: Record<string, unknown> };
}

const doc = JSON.parse(readFileSync(openapiPath, "utf8")) as Doc;

describe("openapi", () => {
  test("src/openapi.ts is generated from api/openapi.json as it is now", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "amber-tssdk-gen-"));
    try {
      const out = path.join(dir, "openapi.ts");
      const cli = path.join(pkgRoot, "node_modules", "openapi-typescript", "bin", "cli.js");
      execFileSync(process.execPath, [cli, openapiPath, "-o", out], { stdio: "pipe" });
      const want = readFileSync(out, "utf8");
      const have = readFileSync(path.join(pkgRoot, "src", "openapi.ts"), "utf8");
      assert.ok(have === want, "src/openapi.ts is stale: run `npm run generate` in sdk/typescript and fix what tsc then reports");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("every operation the SDK calls is in the document", () => {
    const missing: string[] = [];
    for (const [id, [method, p]] of Object.entries(OPERATIONS)) {
      const op = doc.paths[p]?.[method];
      if (!op) missing.push(`${method.toUpperCase()} ${p} (${id}): not in the document`);
      else if (op.operationId !== id) missing.push(`${method.toUpperCase()} ${p}: operationId ${op.operationId}, the SDK says ${id}`);
    }
    assert.deepEqual(missing, []);
    assert.ok(Object.keys(OPERATIONS).length >= 30);
  });

  test("the daemon serves this document", { skip: live ? false : "no daemon" }, async () => {
    const resp = await fetch(new URL("/v1/openapi.json", operator().baseURL));
    assert.equal(resp.status, 200);
    assert.deepEqual(await resp.json(), doc);
  });
});

describe("sse parser", () => {
  const body = (s: string) =>
    new ReadableStream<Uint8Array>({
      start(c) {
        // Split at odd places: a parser must not depend on chunk bounds.
        const b = new TextEncoder().encode(s);
        for (let i = 0; i < b.length; i += 7) c.enqueue(b.subarray(i, i + 7));
        c.close();
      },
    });

  test("fields, comments, multi-line data, ids only on their own event", async () => {
    const got = [];
    for await (const m of sse(body(": keep-alive\n\nid: 7\nevent: a\ndata: {\"x\":1}\n\nevent: d\r\ndata: one\r\ndata: two\r\n\r\ndata:no-space\n\n"))) got.push(m);
    assert.deepEqual(got, [
      { id: "7", event: "a", data: '{"x":1}' },
      { id: undefined, event: "d", data: "one\ntwo" },
      { id: undefined, event: "message", data: "no-space" },
    ]);
  });
});
