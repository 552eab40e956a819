package chunkstore

import "encoding/hex"

// ChunkKey returns the object key of the chunk with plaintext SHA-256
// sumHex, for tests that damage stored objects.
func ChunkKey(s *Store, tenant, sumHex string) string {
	k, err := s.tenantKeys(tenant)
	if err != nil {
		panic(err)
	}
	sum, _ := hex.DecodeString(sumHex)
	return chunkKey(tenant, k.chunkName([32]byte(sum)))
}
