// Package stores holds the implementations of core's storage contracts:
// SQLite and PostgreSQL event logs (stores/sqlite, stores/postgres), the
// metadata store on SQLite and PostgreSQL (stores/sqlmeta), blobs on the
// local filesystem and S3 (stores/localfs, stores/s3). Each passes its
// contract's conformance suite.
//
// May import: core, lib.
package stores
