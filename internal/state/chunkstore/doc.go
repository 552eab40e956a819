// Package chunkstore keeps checkpoint images on a blob.Store:
// content-addressed, incremental, encrypted per tenant, committed
// crash-consistently, verified on restore, garbage-collected safely.
//
// # What is stored
//
// A checkpoint is a directory tree (the driver's image files and a tar of
// the sandbox's writable layer) identified by (tenant, checkpoint id). Put
// splits every file into content-defined chunks (Rabin fingerprints,
// restic/chunker, with a polynomial derived per tenant), so that a second
// checkpoint after a small change shares all chunks but the few around the
// change. Each chunk is compressed (zstd, kept raw when that does not help),
// encrypted (AES-256-GCM) and stored once per tenant under a name that is a
// keyed hash of its plaintext. The chunks a checkpoint adds are written back
// to back into packs of about 4 MiB (pack.go: a restore reads a run of them
// with one ranged read, not one request per chunk); checkpoints written
// before packs (format 1) keep one object per chunk, and both are read.
//
// # Keys and layout
//
//	tenants/<t>/packs/<nn>/<pack>                    sealed chunks back to back; pack = 32 random hex digits
//	tenants/<t>/chunks/<nn>/<name>                   one sealed chunk (format 1); nn = name[:2]
//	tenants/<t>/checkpoints/<id>/manifest.<digest>   the sealed manifest
//	tenants/<t>/checkpoints/<id>/COMMITTED           the pointer: makes <id> visible
//	tenants/<t>/pending/<id>.<nonce>                 a writer in progress (see GC)
//	tenants/<t>/gc.lock                              a collector in progress
//
// <name> is HMAC-SHA256(name key of t, SHA-256(chunk plaintext)) in hex, so
// names say nothing about content to anyone without t's key and the same
// content stored by two tenants has unrelated names: chunks are deduplicated
// within a tenant only (cross-tenant dedup would let one tenant probe what
// another holds). <digest> is the SHA-256 of the manifest's plaintext.
//
// # Encryption
//
// Every tenant's keys are derived from one master key with HKDF-SHA256
// (salt "amber/chunkstore/v1", info naming the tenant and the purpose): an
// AES-256-GCM key that seals chunks and manifests, the HMAC key that names
// chunks, and the seed of the tenant's chunking polynomial. Nothing per
// tenant is stored, so nothing per tenant can be lost; the flip side is that
// a tenant's data is erased by deleting its objects (DeleteTenant lists the
// store to prove it did), not by destroying a key. A sealed object is
//
//	"AMBR" | version (1) | kind (1: chunk, 2: manifest) | codec (0: raw, 1: zstd) | nonce (12) | ciphertext+tag
//
// with the header, the tenant and the object's name as additional
// authenticated data, so an object moved to another name or tenant fails to
// open. Nonces are random (96 bits): fine far beyond any tenant's chunk count.
//
// # Commit protocol and durability order
//
// Put makes a checkpoint visible only once everything it needs is durable:
//
//  1. pending marker: tenants/<t>/pending/<id>.<nonce> (with an expiry) tells
//     a collector that a writer may be about to reference existing chunks.
//  2. chunks: every chunk the parent's manifest does not list is written,
//     in packs; each pack's Put is durable when it returns. All pack writes
//     finish before step 3.
//  3. manifest: format version, tenant, id, every file with its mode, size,
//     SHA-256 and chunk list (plaintext SHA-256 and size of each chunk, and
//     its pack, offset and sealed length), and
//     the whole-image digest; sealed and written under a name that includes
//     its digest, so manifests are immutable.
//  4. commit hook: PutOptions.Commit(ctx, digest, publish) is called; it
//     checks the writer's lease epoch (refusing a stale writer) and calls
//     publish, which writes the pointer, ideally while holding whatever
//     keeps the epoch current, then records the checkpoint in the session
//     log. Without a hook, the pointer is written directly.
//  5. pointer: tenants/<t>/checkpoints/<id>/COMMITTED, written with
//     PutIfAbsent, names the manifest digest. The checkpoint exists from this
//     moment; a crash at any earlier point leaves only unreferenced objects
//     that the collector removes, and never touches an earlier checkpoint
//     (objects are never overwritten: chunks are content-named and written
//     once, manifests are digest-named).
//  6. the pending marker is deleted.
//
// Restore reads the pointer, the manifest (checking its digest), and every
// chunk (AES-GCM opens it only if it is the chunk sealed under its name;
// its size is checked), then the whole-image digest; Verify also hashes
// each chunk and each file again (Restore does not: a file is its
// authenticated chunks in order); any mismatch, missing object or failed decryption is
// errdefs.ErrDataLoss naming the file and chunk. It writes into a temporary
// directory that is renamed to the target only when all of it verified.
//
// # Garbage collection
//
// GC deletes, for one tenant, the packs and chunk objects no committed
// manifest references and manifests no pointer names (a pack goes whole,
// once none of its chunks is referenced; packs are not rewritten). A writer may find a chunk already stored
// and reference it without writing it, so a collector must never delete a
// chunk between a writer's check and its commit. The two sides use markers
// (Dekker style: each writes its own marker, then reads the other's, over a
// store with read-after-write consistency, so at least one sees the other):
//
//   - a writer writes its pending marker, then looks for gc.lock; while a live
//     one exists it waits (its checks would race the deletions);
//   - a collector writes gc.lock (PutIfAbsent: one collector per tenant), then
//     lists pending markers; if any live one exists it stops without
//     deleting anything (Deferred) and a later run collects.
//
// Markers carry an expiry (a writer's Config.PendingTTL, default one hour;
// gc.lock's Config.GCLockTTL, default 30 s, since writers wait for it) so
// that a crashed writer or collector blocks the other side only until then.
// Both renew theirs while they work (a collector at every step). A writer checks its marker still exists
// (and is not about to expire) right before it publishes, so a writer whose
// marker was declared dead (expired, removed by a collector) aborts with
// errdefs.ErrConflict instead of committing a checkpoint whose chunks may
// have been collected; a collector whose lock is about to expire stops
// deleting. Expiry is judged by the
// Config.Clock of the process that reads a marker, so clocks across nodes
// must agree to well within GCLockTTL.
//
// DeleteCheckpoint removes the pointer first (the checkpoint is invisible
// from then on), then its manifests, then collects. DeleteTenant removes
// every object under tenants/<t>/ and lists the prefix to prove it is empty.
package chunkstore
