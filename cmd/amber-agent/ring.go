package main

import "github.com/amber-run/amber/lib/agentproto"

// ring is a process's recent output: chunks in the order the process wrote
// them (stdout and stderr interleaved), numbered by one byte offset that
// counts everything the process ever wrote. When the ring holds more than
// its capacity, the oldest chunks fall out; a reader asking for an offset
// before the first kept byte is told how many bytes it lost.
//
// It is not safe for concurrent use; the process's lock guards it.
type ring struct {
	cap    int
	size   int
	chunks []chunk
	end    int64 // offset after the last byte written
}

type chunk struct {
	kind agentproto.FrameKind
	off  int64
	data []byte
}

func newRing(capacity int) *ring { return &ring{cap: capacity} }

// write appends p (copied) as output of kind.
func (r *ring) write(kind agentproto.FrameKind, p []byte) {
	if len(p) == 0 {
		return
	}
	for len(p) > 0 {
		n := len(p)
		if n > agentproto.MaxFrameData {
			n = agentproto.MaxFrameData
		}
		r.chunks = append(r.chunks, chunk{kind: kind, off: r.end, data: append([]byte(nil), p[:n]...)})
		r.end += int64(n)
		r.size += n
		p = p[n:]
	}
	for r.size > r.cap && len(r.chunks) > 1 {
		r.size -= len(r.chunks[0].data)
		r.chunks[0] = chunk{}
		r.chunks = r.chunks[1:]
	}
	if r.size > r.cap && len(r.chunks) == 1 { // one chunk bigger than the ring: keep its tail
		c := &r.chunks[0]
		cut := r.size - r.cap
		c.data = append([]byte(nil), c.data[cut:]...)
		c.off += int64(cut)
		r.size = r.cap
	}
}

// start is the offset of the first byte still kept.
func (r *ring) start() int64 {
	if len(r.chunks) == 0 {
		return r.end
	}
	return r.chunks[0].off
}

// from returns the frames holding output from offset on (at most max bytes
// in all, at least one frame when there is output) and the offset after
// them. An offset before start() is the caller's to report as lost; an
// offset after end as rewound.
func (r *ring) from(offset int64, max int) ([]agentproto.Frame, int64) {
	var out []agentproto.Frame
	n := 0
	for _, c := range r.chunks {
		cend := c.off + int64(len(c.data))
		if cend <= offset {
			continue
		}
		d := c.data
		if c.off < offset {
			d = d[offset-c.off:]
		}
		if n > 0 && n+len(d) > max {
			break
		}
		out = append(out, agentproto.Frame{Kind: c.kind, Offset: cend - int64(len(d)), Data: d})
		n += len(d)
		offset = cend
	}
	return out, offset
}

// clear drops every kept byte (the offsets go on).
func (r *ring) clear() {
	r.chunks, r.size = nil, 0
}
