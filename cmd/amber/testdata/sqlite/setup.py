"""A SQLite-heavy agent setup (issue 21, "The sandbox's own speed").

Builds a table of ROWS rows (default 400,000) in DIR/amber-bench.db (DIR
default /root) with the durability an agent's tool would ask for (WAL,
synchronous=FULL, a commit every 1,000 rows), adds an index, then counts
the words of every row in memory, reading them in index order. The text is
pseudo-random from a fixed seed, so every run on every stack prints the
same summary line; the benchmark compares it across stacks (the same work
was done) and times the run from outside.

With "check" as the third argument it only reads an existing database
back (integrity_check, then the same count): after a restore, the same line
means the database came back exactly.

SQLITE_CACHE_KIB, when set, is SQLite's page cache (PRAGMA cache_size) for
the run instead of its default 2 MiB: an experiment on where the time goes
(the word count reads the rows in index order, one pread(2) per row when
the table does not fit the cache), not part of the setup the issue names.

Usage: python3 setup.py [DIR] [ROWS] [check]   (or the script on stdin: python3 - …)
"""

import collections
import hashlib
import os
import random
import sqlite3
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "/root"
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 400_000
check = len(sys.argv) > 3 and sys.argv[3] == "check"
path = os.path.join(d, "amber-bench.db")


def connect():
    db = sqlite3.connect(path, isolation_level=None)
    if os.environ.get("SQLITE_CACHE_KIB"):
        db.execute(f"PRAGMA cache_size=-{int(os.environ['SQLITE_CACHE_KIB'])}")
    return db


def build():
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    rng = random.Random(21)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    db = connect()
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, body TEXT NOT NULL)")
    db.execute("BEGIN")
    for i in range(1, rows + 1):
        body = " ".join(rng.choices(vocab, k=12))
        db.execute("INSERT INTO docs (id, tag, body) VALUES (?, ?, ?)", (i, vocab[i % len(vocab)], body))
        if i % 1000 == 0:
            db.execute("COMMIT")
            db.execute("BEGIN")
    db.execute("COMMIT")
    db.execute("CREATE INDEX docs_tag ON docs (tag)")
    return db


if check:
    db = connect()
    ok = db.execute("PRAGMA integrity_check").fetchone()[0]
    n = db.execute("SELECT count(*) FROM docs").fetchone()[0]
    if ok != "ok" or n != rows:
        sys.exit(f"database after the restore: integrity_check {ok!r}, {n} rows, want ok and {rows}")
else:
    db = build()

counts = collections.Counter()
for (body,) in db.execute("SELECT body FROM docs INDEXED BY docs_tag ORDER BY tag"):
    counts.update(body.split())
db.close()

h = hashlib.sha256()
for w, n in sorted(counts.items()):
    h.update(f"{w} {n}\n".encode())
print(f"sqlite-setup rows={rows} words={sum(counts.values())} distinct={len(counts)} sha256={h.hexdigest()[:16]}")
