// API keys and tenants through the SDK: a read-only key is refused writes
// (403), another tenant's resources do not exist for a key (404, absent
// from lists), a revoked or unknown key is 401.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AmberError, Client, type Sandbox } from "../src/index.js";
import { operator, skipLive, unique } from "./env.js";

describe("tenancy", { skip: skipLive }, () => {
  const op = operator();
  const addr = process.env.AMBER_ADDR!;
  const tenantA = unique("ts-a");
  const tenantB = unique("ts-b");
  let a: Client;
  let aRead: Client;
  let b: Client;
  let sbA: Sandbox;

  before(async () => {
    await op.createTenant(tenantA, { name: "TypeScript SDK A" });
    await op.createTenant(tenantB);
    a = new Client({ addr, token: (await op.createKey(tenantA, "dev", { scopes: ["read", "write"] })).key! });
    aRead = new Client({ addr, token: (await op.createKey(tenantA, "viewer", { scopes: ["read"] })).key! });
    // B's key is its tenant's admin: it manages B, and still sees nothing of A.
    b = new Client({ addr, token: (await op.createKey(tenantB, "admin", { scopes: ["read", "write", "admin"] })).key! });
    sbA = await a.createSandbox({ template: "minimal", cold: true });
  });
  after(async () => {
    if (sbA) await a.destroySandbox(sbA.id).catch(() => {});
  });

  test("a key sees its tenant's sandboxes", async () => {
    assert.equal(sbA.tenant, tenantA);
    assert.ok((await a.listSandboxes()).some((s) => s.id === sbA.id));
    assert.equal((await aRead.getSandbox(sbA.id)).id, sbA.id);
  });

  test("a read-only key may look but not change (403)", async () => {
    const refused = (e: AmberError) => {
      assert.ok(e instanceof AmberError);
      assert.equal(e.status, 403);
      assert.equal(e.kind, "permission denied");
      return true;
    };
    await assert.rejects(aRead.createSandbox({ template: "minimal", cold: true }), refused);
    await assert.rejects(aRead.destroySandbox(sbA.id), refused);
    await assert.rejects(aRead.writeFile(sbA.id, "/x", "y"), refused);
    await assert.rejects(aRead.createSession({ model: { adapter: "scripted", script: [] } }), refused);
    // Still there, still its own.
    assert.equal((await a.getSandbox(sbA.id)).state, sbA.state);
  });

  test("another tenant's sandbox does not exist for a key (404, not listed)", async () => {
    const hidden = (e: AmberError) => e instanceof AmberError && e.status === 404 && e.kind === "not found";
    await assert.rejects(b.getSandbox(sbA.id), hidden);
    await assert.rejects(b.destroySandbox(sbA.id), hidden);
    await assert.rejects(b.events(sbA.id), hidden);
    await assert.rejects(b.checkpoints(sbA.id), hidden);
    assert.ok(!(await b.listSandboxes()).some((s) => s.id === sbA.id));
    // Nor its keys.
    await assert.rejects(b.keys(tenantA), hidden);
    // The operator's default tenant is another tenant too.
    const mine = await op.listSandboxes();
    assert.ok(!mine.some((s) => s.id === sbA.id), "the operator's own list holds only the default tenant's sandboxes");
    assert.equal((await a.getSandbox(sbA.id)).tenant, tenantA);
  });

  test("tenants and keys need the operator's key", async () => {
    await assert.rejects(a.createTenant(unique("ts-c")), (e: AmberError) => e.status === 403 || e.status === 404);
    assert.ok((await op.tenants()).some((t) => t.id === tenantA));
    const keys = await op.keys(tenantA);
    assert.deepEqual(keys.map((k) => k.name).sort(), ["dev", "viewer"]);
    assert.ok(keys.every((k) => k.key === undefined), "a listed key never shows its secret");
  });

  test("unknown and revoked keys are 401", async () => {
    const bad = new Client({ addr, token: "amber_not_a_key" });
    await assert.rejects(bad.listSandboxes(), (e: AmberError) => e.status === 401 && e.kind === "unauthenticated");
    const k = await op.createKey(tenantB, "short-lived", { scopes: ["read"] });
    const tmp = new Client({ addr, token: k.key! });
    assert.deepEqual(await tmp.listSandboxes(), []);
    await op.revokeKey(tenantB, "short-lived");
    await assert.rejects(tmp.listSandboxes(), (e: AmberError) => e.status === 401);
  });

  test("a daemon that is not there is 'unavailable'", async () => {
    const gone = new Client({ addr: "127.0.0.1:1", token: "x" });
    await assert.rejects(gone.info(), (e: AmberError) => e.kind === "unavailable" && e.status === undefined);
    assert.throws(() => new Client({ addr: "ftp://example" }), (e: AmberError) => e.kind === "invalid argument");
  });
});
