package chunkstore

import "encoding/hex"

// ChunkPlace returns the key of the object that holds chunk c and where in
// it c's sealed bytes are (the whole object when c has no pack), for tests
// that damage stored objects.
func ChunkPlace(s *Store, tenant string, c ChunkRef) (key string, off, n int64) {
	if c.Pack != "" {
		return packKey(tenant, c.Pack), c.Offset, c.Sealed
	}
	k, err := s.tenantKeys(tenant)
	if err != nil {
		panic(err)
	}
	sum, _ := hex.DecodeString(c.SHA256)
	return chunkKey(tenant, k.chunkName([32]byte(sum))), 0, -1
}
