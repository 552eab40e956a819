package chunkstore

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Object kinds, bound into the authenticated data of a sealed object.
const (
	kindChunk    byte = 1
	kindManifest byte = 2
)

const (
	codecRaw  byte = 0
	codecZstd byte = 1
)

const (
	sealVersion = 1
	headerLen   = 4 + 1 + 1 + 1 + 12 // magic, version, kind, codec, nonce
	sealMagic   = "AMBR"
)

// SealOverhead is the size a sealed object adds to its (compressed) payload.
const SealOverhead = headerLen + 16

var (
	encOnce sync.Once
	encoder *zstd.Encoder
	decoder *zstd.Decoder
)

func codecs() (*zstd.Encoder, *zstd.Decoder) {
	encOnce.Do(func() {
		var err error
		// EncodeAll/DecodeAll are safe for concurrent use; one encoder
		// state per core is enough.
		encoder, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(4))
		if err != nil {
			panic(err)
		}
		decoder, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(4), zstd.WithDecoderMaxMemory(64<<20))
		if err != nil {
			panic(err)
		}
	})
	return encoder, decoder
}

// aad is the additional authenticated data of a sealed object.
func aad(header []byte, tenant, name string) []byte {
	b := make([]byte, 0, len(header)+len(tenant)+len(name)+2)
	b = append(b, header...)
	b = append(b, tenant...)
	b = append(b, 0)
	b = append(b, name...)
	return b
}

// seal compresses (when that helps) and encrypts plain as an object of kind
// named name, appending to dst. scratch, when not nil, is reused for the
// compressed form.
func (k *tenantKeys) seal(dst []byte, kind byte, name string, plain []byte, scratch *[]byte) []byte {
	enc, _ := codecs()
	codec, payload := codecRaw, plain
	if len(plain) > 64 {
		var buf []byte
		if scratch != nil {
			buf = (*scratch)[:0]
		}
		z := enc.EncodeAll(plain, buf)
		if scratch != nil {
			*scratch = z
		}
		// Keep zstd only when it saves at least 1/32: random data (and
		// already-compressed files) is stored raw and restored faster.
		if len(z) < len(plain)-len(plain)/32 {
			codec, payload = codecZstd, z
		}
	}
	header := make([]byte, headerLen)
	copy(header, sealMagic)
	header[4], header[5], header[6] = sealVersion, kind, codec
	if _, err := rand.Read(header[7:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	dst = append(dst, header...)
	return k.aead.Seal(dst, header[7:], payload, aad(header, k.tenant, name))
}

var errSealFormat = errors.New("not a sealed object of this kind")

// open reverses seal. Every failure means the object is corrupt, tampered
// with, or not what its name says: callers report it as data loss. obj is
// decrypted in place (its bytes are lost); the result may share its
// memory.
func (k *tenantKeys) open(kind byte, name string, obj []byte, maxPlain int) ([]byte, error) {
	if len(obj) < SealOverhead || string(obj[:4]) != sealMagic {
		return nil, errSealFormat
	}
	header := obj[:headerLen]
	if header[4] != sealVersion {
		return nil, fmt.Errorf("sealed with unknown version %d", header[4])
	}
	if header[5] != kind {
		return nil, errSealFormat
	}
	// Opened in place: the plaintext takes the ciphertext's room (obj is
	// the caller's to give up), one chunk-sized allocation less.
	payload, err := k.aead.Open(obj[headerLen:headerLen], header[7:], obj[headerLen:], aad(header, k.tenant, name))
	if err != nil {
		return nil, errors.New("authentication failed (corrupt or tampered)")
	}
	switch header[6] {
	case codecRaw:
		return payload, nil
	case codecZstd:
		_, dec := codecs()
		plain, err := dec.DecodeAll(payload, make([]byte, 0, min(maxPlain, 4<<20)))
		if err != nil {
			return nil, fmt.Errorf("decompress: %w", err)
		}
		if len(plain) > maxPlain {
			return nil, fmt.Errorf("decompressed to %d bytes, more than %d", len(plain), maxPlain)
		}
		return plain, nil
	}
	return nil, fmt.Errorf("unknown codec %d", header[6])
}
