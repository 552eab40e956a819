#!/usr/bin/env python3
"""An agent's workspace built the expensive way, for `make bench-session`.

    workspace.py setup DIR DOCS   build DIR: a generated project byte-compiled,
                                  then a dataset of DOCS thousand documents
                                  indexed (terms, document frequencies, MinHash
                                  signatures in LSH buckets), on two worker
                                  processes; prints "setup cpu=S digest=D".
    workspace.py serve DIR PORT   the dev server: loads DIR's index into
                                  memory and answers on 127.0.0.1:PORT
                                  GET /state (the index's digest, the tool
                                  calls it has seen, its pid) and
                                  GET /call?n=N&term=T (a tool call: records
                                  N, answers T's document frequency and the
                                  largest LSH bucket).
    workspace.py call DIR PORT N  tool call N: appends to DIR/calls.log and
                                  asks the dev server.

Everything is computed here from a fixed seed: nothing is fetched, nothing
sleeps, and every run of the same DOCS prints the same digest.
"""
import hashlib
import http.server
import json
import os
import py_compile
import random
import resource
import sys
import urllib.request
from multiprocessing import Pool

SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
HASHES = 96          # MinHash functions
BANDS = 24           # LSH bands of HASHES // BANDS rows
PRIME = (1 << 61) - 1


def vocabulary(n=6000):
    rng = random.Random(7)
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def compile_project(root):
    """Writes 240 modules of generated functions and byte-compiles them."""
    rng = random.Random(11)
    src = os.path.join(root, "project")
    os.makedirs(src, exist_ok=True)
    for m in range(240):
        lines = []
        for f in range(60):
            ops = " + ".join(f"(x * {rng.randint(1, 97)} ^ {rng.randint(0, 1 << 20)})" for _ in range(8))
            lines.append(f"def f{f}(x):\n    if x > {rng.randint(0, 1000)}:\n        return {ops}\n    return x - {f}\n")
        path = os.path.join(src, f"mod{m}.py")
        with open(path, "w") as fh:
            fh.write("\n".join(lines))
        py_compile.compile(path, doraise=True)


def shard(args):
    """Indexes documents [lo, hi): document frequencies and LSH buckets."""
    lo, hi = args
    words = vocabulary()
    rng = random.Random(1000 + lo)
    coeffs = [(random.Random(h).randrange(1, PRIME), random.Random(-h).randrange(PRIME)) for h in range(HASHES)]
    rows = HASHES // BANDS
    df, buckets = {}, {}
    for doc in range(lo, hi):
        tokens = [words[int(rng.paretovariate(1.1)) % len(words)] for _ in range(rng.randint(30, 70))]
        terms = set(tokens)
        for t in terms:
            df[t] = df.get(t, 0) + 1
        hs = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") for t in terms]
        sig = [min((a * h + b) % PRIME for h in hs) for a, b in coeffs]
        for band in range(BANDS):
            key = (band, hash(tuple(sig[band * rows:(band + 1) * rows])) & 0xFFFFFFFF)
            buckets.setdefault(key, []).append(doc)
    return df, {f"{k[0]}:{k[1]}": v for k, v in buckets.items() if len(v) > 1}


def setup(root, kdocs):
    os.makedirs(root, exist_ok=True)
    compile_project(root)
    n = kdocs * 1000
    step = 2000
    with Pool(2) as pool:
        parts = pool.map(shard, [(lo, min(lo + step, n)) for lo in range(0, n, step)])
    df, buckets = {}, {}
    for pdf, pb in parts:
        for t, c in pdf.items():
            df[t] = df.get(t, 0) + c
        for k, v in pb.items():
            buckets.setdefault(k, []).extend(v)
    index = {"docs": n, "df": df, "buckets": buckets}
    blob = json.dumps(index, sort_keys=True).encode()
    with open(os.path.join(root, "index.json"), "wb") as fh:
        fh.write(blob)
    digest = hashlib.sha256(blob).hexdigest()[:16]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(f"setup cpu={cpu:.1f} digest={digest}", flush=True)


def serve(root, port):
    with open(os.path.join(root, "index.json"), "rb") as fh:
        blob = fh.read()
    index = json.loads(blob)
    digest = hashlib.sha256(blob).hexdigest()[:16]
    # The dev server's own state, built on load and by the calls: what a
    # restore must bring back.
    postings = {}
    for key, docs in index["buckets"].items():
        for d in docs:
            postings.setdefault(d, []).append(key)
    largest = max(index["buckets"].values(), key=len) if index["buckets"] else []
    calls = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, obj):
            b = json.dumps(obj, sort_keys=True).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self):
            path, _, query = self.path.partition("?")
            q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            if path == "/state":
                self.answer({"digest": digest, "calls": calls, "pid": os.getpid(), "docs_in_buckets": len(postings)})
            elif path == "/call":
                calls.append(int(q.get("n", "0")))
                self.answer({"n": calls[-1], "df": index["df"].get(q.get("term", ""), 0), "largest_bucket": len(largest)})
            else:
                self.send_error(404)

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def call(root, port, n):
    words = vocabulary()
    term = words[(n * 7919) % len(words)]
    with open(os.path.join(root, "calls.log"), "a") as fh:
        fh.write(f"{n} {term}\n")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/call?n={n}&term={term}", timeout=30) as r:
        print(r.read().decode(), flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "setup":
        setup(sys.argv[2], int(sys.argv[3]))
    elif cmd == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif cmd == "call":
        call(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd!r}")
