package metadata

import (
	"time"
)

// CheckpointState is where a checkpoint is in its life.
//
//	pending ──▶ committed ──Delete──▶ deleted
//	   └──────▶ failed
//
// A pending row is written before the first byte of the image (intent
// before effect); the image becomes visible in the blob store at its commit
// pointer, and the row becomes committed after that. A daemon that dies in
// between finds the row pending at its next start and settles it by asking
// the blob store whether the pointer exists (engine.reconcileCheckpoints).
//
// A checkpoint committed locally (the strict policy on a node whose stores
// are its own) is committed before its image is in the blob store: its
// UploadPending mark says the image is only the node's hot copy, whose
// integrity record is HotDigest, until FinishUpload records the manifest
// and clears the mark. One whose hot copy is lost before the upload ends
// goes committed ──▶ failed and keeps the mark (its image never reached
// the blob store).
type CheckpointState string

// The checkpoint states.
const (
	CheckpointPending   CheckpointState = "pending"
	CheckpointCommitted CheckpointState = "committed"
	CheckpointFailed    CheckpointState = "failed"
	CheckpointDeleted   CheckpointState = "deleted"
)

// Checkpoint is one row of the checkpoints table: what the engine knows of
// a checkpoint whose image lives in the chunk store under (Tenant, ID).
type Checkpoint struct {
	ID        string          `json:"id"`
	Tenant    string          `json:"tenant"`
	SandboxID string          `json:"sandbox_id"`
	State     CheckpointState `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	// Parent is the sandbox's previous committed checkpoint ("" if none):
	// the chunk store skips looking up the chunks it already holds.
	Parent string `json:"parent,omitempty"`
	// Tag, when set, exempts the checkpoint from retention.
	Tag string `json:"tag,omitempty"`
	// Stream and Seq are the log position of the cut: every event of
	// Stream up to Seq happened before it, none after. EventSeq is the
	// position of the sandbox.checkpointed event (which carries the
	// checkpoint reference the log may be truncated to).
	Stream   string `json:"stream"`
	Seq      uint64 `json:"seq"`
	EventSeq uint64 `json:"event_seq,omitempty"`
	// What the image needs to be restored.
	Driver          string `json:"driver"`
	Template        string `json:"template"`
	TemplateVersion string `json:"template_version"`
	// UploadPending marks a checkpoint committed locally whose image is
	// not yet in the blob store (no manifest, no pointer): only the node's
	// hot copy holds it. HotDigest is that copy's integrity record (the
	// digest of its file list: sizes, times, inodes, and the manifest
	// metadata it will carry), set at the local commit; a restore before
	// the upload ends checks the copy against it instead of the manifest.
	UploadPending bool   `json:"upload_pending,omitempty"`
	HotDigest     string `json:"hot_digest,omitempty"`
	// Filled once committed (ManifestDigest and ImageDigest, for a
	// checkpoint committed locally, once its upload ended).
	ManifestDigest string          `json:"manifest_digest,omitempty"`
	ImageDigest    string          `json:"image_digest,omitempty"`
	Stats          CheckpointStats `json:"stats"`
	Created        time.Time       `json:"created"`
	Updated        time.Time       `json:"updated"`
}

// CheckpointStats are the figures of one checkpoint.
type CheckpointStats struct {
	FrozenNS    int64 `json:"frozen_ns"`
	DumpNS      int64 `json:"dump_ns"`
	UploadNS    int64 `json:"upload_ns"`
	TotalNS     int64 `json:"total_ns"`
	MemoryBytes int64 `json:"memory_bytes"`
	LayerBytes  int64 `json:"layer_bytes"`
	// ImageBytes is the image's size; StoredBytes what this checkpoint
	// added to the store after deduplication and compression.
	ImageBytes  int64 `json:"image_bytes"`
	StoredBytes int64 `json:"stored_bytes"`
	Chunks      int   `json:"chunks"`
	NewChunks   int   `json:"new_chunks"`
}

// CheckpointFilter selects rows for Checkpoints; zero fields select all.
type CheckpointFilter struct {
	Tenant    string
	SandboxID string
	States    []CheckpointState
}
