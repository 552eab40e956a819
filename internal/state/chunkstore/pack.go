package chunkstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/amber-run/amber/core/blob"
)

// Packs.
//
// A chunk is 64–512 KiB, so a 256 MiB memory image is about 1,400 chunks. As
// one object each, a restore from MinIO on this machine took 2.35 s where the
// same pipeline over a local directory took 0.35 s: every object is one GET,
// and MinIO's per-object work (metadata, bitrot hashes, the HTTP exchange)
// costs about a millisecond of CPU on the same two cores. So Put writes the
// chunks a checkpoint adds into packs instead: objects of about
// Config.PackSize bytes holding sealed chunks back to back, in the order the
// manifest lists them, and the manifest records each chunk's pack, offset and
// sealed length. Restore reads runs of chunks that lie back to back in one
// pack with one ranged read.
//
// What does not change: a chunk is sealed exactly as it would be as its own
// object (its additional data names the chunk, not the pack), so a sealed
// chunk moved to another pack, offset or tenant fails to open; the pack's
// name, offset and length are inside the sealed manifest, so nobody without
// the tenant's key can point a manifest elsewhere. Deduplication is by chunk
// name against the parent checkpoint's manifest (whose chunk list carries
// every chunk it uses, wherever stored) and within the Put.
//
// The durability order holds: every pack of a Put is durable before its
// manifest is written. A pack is garbage once no committed manifest
// references any chunk in it; the collector deletes whole packs only (a pack
// some of whose chunks are still used stays whole: no repacking yet).

// DefaultPackSize is the size a pack is closed at (Config.PackSize).
const DefaultPackSize = 4 << 20

// maxRead bounds one ranged read of a restore (and so its memory).
const maxRead = 8 << 20

// newPackName returns a random pack name: 32 hex digits.
func newPackName() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func isPackName(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// checkPlace validates where a chunk reference says the chunk is stored.
func (c ChunkRef) checkPlace(maxChunk int64) error {
	if c.Pack == "" {
		if c.Offset != 0 || c.Sealed != 0 {
			return fmt.Errorf("an offset or length without a pack")
		}
		return nil
	}
	if !isPackName(c.Pack) {
		return fmt.Errorf("bad pack name %q", c.Pack)
	}
	if c.Offset < 0 || c.Sealed < SealOverhead || c.Sealed > maxChunk+SealOverhead+1024 {
		return fmt.Errorf("bad place %d+%d in pack %s", c.Offset, c.Sealed, c.Pack)
	}
	return nil
}

// packer assembles the sealed chunks of one Put into packs. Workers seal in
// parallel and add in the order the chunks were queued (seq), so a pack
// holds a run of the manifest; the worker whose chunk fills a pack writes
// it. At most Concurrency packs are written at once.
type packer struct {
	u    *uploader
	size int

	mu   sync.Mutex
	cond *sync.Cond
	next int64 // the seq added next
	name string
	buf  []byte
	locs map[string]ChunkRef // chunk name → its place in a pack
	stop func() bool
}

func newPacker(u *uploader, size int) *packer {
	p := &packer{u: u, size: size, locs: map[string]ChunkRef{}}
	p.cond = sync.NewCond(&p.mu)
	// A cancelled Put wakes the workers waiting for their turn.
	p.stop = context.AfterFunc(u.ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cond.Broadcast()
	})
	return p
}

// add appends chunk name's sealed bytes as number seq, writing the pack if
// that fills it. Every seq must be added (or the Put cancelled): the next
// one waits for it.
func (p *packer) add(seq int64, name string, sealed []byte) error {
	p.mu.Lock()
	for p.next != seq && p.u.ctx.Err() == nil {
		p.cond.Wait()
	}
	if p.u.ctx.Err() != nil {
		p.mu.Unlock()
		return context.Cause(p.u.ctx)
	}
	if p.name == "" {
		p.name = newPackName()
		p.buf = make([]byte, 0, p.size+MaxChunk+SealOverhead+1024)
	}
	p.locs[name] = ChunkRef{Pack: p.name, Offset: int64(len(p.buf)), Sealed: int64(len(sealed))}
	p.buf = append(p.buf, sealed...)
	p.next++
	var full []byte
	fullName := p.name
	if len(p.buf) >= p.size {
		full, p.buf, p.name = p.buf, nil, ""
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	if full == nil {
		return nil
	}
	return p.write(fullName, full)
}

// flush writes the last, partly filled pack; called once every worker is
// done.
func (p *packer) flush() error {
	p.stop()
	p.mu.Lock()
	name, buf := p.name, p.buf
	p.name, p.buf = "", nil
	p.mu.Unlock()
	if len(buf) == 0 {
		return nil
	}
	return p.write(name, buf)
}

func (p *packer) write(name string, b []byte) error {
	key := packKey(p.u.tenant, name)
	if err := blob.PutBytes(p.u.ctx, p.u.s.cfg.Blobs, key, b); err != nil {
		return fmt.Errorf("write pack %s: %w", key, err)
	}
	p.u.stored.Add(int64(len(b)))
	return nil
}

// place fills in where each chunk of entries is stored: in a pack this Put
// wrote, or where the parent's manifest says (known). A chunk with neither
// is its own object.
func (u *uploader) place(entries []Entry, known map[string]ChunkRef) {
	var locs map[string]ChunkRef
	if u.pk != nil {
		locs = u.pk.locs
	}
	for i := range entries {
		for ci := range entries[i].Chunks {
			c := &entries[i].Chunks[ci]
			sum, _ := hex.DecodeString(c.SHA256)
			name := u.keys.chunkName([32]byte(sum))
			l, ok := locs[name]
			if !ok {
				l = known[name]
			}
			c.Pack, c.Offset, c.Sealed = l.Pack, l.Offset, l.Sealed
		}
	}
}
