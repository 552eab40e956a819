// The published layout: the package imports by its own name through its
// "exports" (Node's self-reference), from the tsc build in dist/, with the
// declarations where "types" says.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { pkgRoot } from "./env.js";

test("the package imports by its name from dist, with its types", async () => {
  const pkg = JSON.parse(readFileSync(path.join(pkgRoot, "package.json"), "utf8"));
  assert.equal(pkg.name, "@amber-run/sdk");
  assert.equal(pkg.type, "module");
  assert.deepEqual(pkg.dependencies ?? {}, {}, "no runtime dependencies");
  const exp = pkg.exports["."];
  for (const f of [exp.import, exp.types, pkg.types]) assert.ok(existsSync(path.join(pkgRoot, f)), `${f} is missing: npm run build`);
  assert.ok(pkg.files.includes("dist"));
  const sdk = await import(pkg.name);
  assert.equal(typeof sdk.Client, "function");
  assert.equal(typeof sdk.AmberError, "function");
  assert.ok(Object.keys(sdk.OPERATIONS).includes("streamSessionEvents"));
  const c = new sdk.Client({ addr: "https://amber.example.com/base/", token: "t" });
  assert.equal(c.baseURL, "https://amber.example.com/base");
});
