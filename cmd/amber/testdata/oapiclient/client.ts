// A client generated from api/openapi.json alone (openapi-typescript makes
// openapi.ts; openapi-fetch calls it), as any user of the document would
// write one: no cast, no hand-written type. cmd/amber's
// TestE2EOpenAPIClient generates openapi.ts from the document as it is,
// compiles this with tsc --strict (the compile is half the test: a union
// that does not discriminate, or a field the document leaves optional,
// fails it) and runs it against a daemon (AMBER_ADDR, AMBER_TOKEN).
import createClient from "openapi-fetch";
import type { components, paths } from "./openapi.js";

type FileList = components["schemas"]["FileList"];
type FileInfo = components["schemas"]["FileInfo"];
// The line type of the exec stream, as the document names it for
// application/x-ndjson.
type ExecLine = paths["/v1/sandboxes/{id}/exec"]["post"]["responses"][200]["content"]["application/x-ndjson"];

const baseUrl = `http://${process.env.AMBER_ADDR}`;
const headers = { Authorization: `Bearer ${process.env.AMBER_TOKEN}` };
// JSON answers only: a file's raw content (application/octet-stream) is
// not what these calls read.
const api = createClient<paths, "application/json">({ baseUrl, headers });

function fail(what: string, v: unknown): never {
  throw new Error(`${what}: ${JSON.stringify(v)}`);
}

// listing narrows GET …/files' answer by its own properties: a FileList
// has entries, a FileInfo does not.
function listing(l: FileList | FileInfo): string[] {
  // @ts-expect-error entries is not known before the answer is narrowed
  void l.entries;
  if ("entries" in l) {
    const dir: FileList = l;
    return dir.entries.map((e) => `${e.name} ${e.type} ${e.size} ${e.mtime.slice(0, 4)}`);
  }
  const file: FileInfo = l;
  return [`${file.name} ${file.type} ${file.size} ${file.mode}`];
}

// execStream reads the NDJSON stream of POST …/exec line by line.
async function execStream(id: string, cmd: string): Promise<{ out: string; err: string; code: number; lines: number }> {
  const { data, error, response } = await api.POST("/v1/sandboxes/{id}/exec", {
    params: { path: { id } },
    body: { args: ["sh", "-c", cmd] },
    parseAs: "stream",
  });
  if (error || !data) fail(`exec: ${response.status}`, error);
  const got = { out: "", err: "", code: -1, lines: 0 };
  const text = new TextDecoder();
  let buf = "";
  const take = (line: string) => {
    if (line === "") return;
    const fr: ExecLine = JSON.parse(line);
    got.lines++;
    if (fr.error) fail("exec frame error", fr.error);
    if (fr.data !== undefined) {
      const s = Buffer.from(fr.data, "base64").toString();
      if (fr.stream === "stdout") got.out += s;
      else if (fr.stream === "stderr") got.err += s;
    }
    if (fr.exit) got.code = fr.exit.code;
  };
  const reader = data.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += text.decode(value, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      take(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
  }
  take(buf);
  return got;
}

async function main() {
  const created = await api.POST("/v1/sandboxes", { body: { template: "minimal" } });
  if (!created.data) fail(`create: ${created.response.status}`, created.error);
  const id = created.data.id;
  try {
    const ex = await execStream(id, "mkdir -p /work/sub && printf abc > /work/a.txt && echo out && echo err >&2 && exit 3");
    console.log(`exec out=${JSON.stringify(ex.out)} err=${JSON.stringify(ex.err)} code=${ex.code} lines=${ex.lines}`);

    const dir = await api.GET("/v1/sandboxes/{id}/files", { params: { path: { id }, query: { path: "/work" } } });
    if (!dir.data) fail(`list: ${dir.response.status}`, dir.error);
    console.log(`list ${listing(dir.data).sort().join(", ")}`);

    const st = await api.GET("/v1/sandboxes/{id}/files", { params: { path: { id }, query: { path: "/work/a.txt", stat: true } } });
    if (!st.data) fail(`stat: ${st.response.status}`, st.error);
    console.log(`stat ${listing(st.data).join(", ")}`);

    const missing = await api.GET("/v1/sandboxes/{id}", { params: { path: { id: "sbx-nosuchsandbox00" } } });
    console.log(`missing ${missing.response.status} ${missing.error?.error.kind}`);
  } finally {
    const del = await api.DELETE("/v1/sandboxes/{id}", { params: { path: { id } } });
    console.log(`delete ${del.response.status}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
