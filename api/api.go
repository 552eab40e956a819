// Package api holds Amber's HTTP wire types and its OpenAPI document. It
// imports nothing from Amber: the server (internal/edge/server) and the Go SDK
// (client/) both speak these types.
//
// Conventions: every path is under /v1; bodies are JSON; an error is
// {"error":{"kind":…,"message":…}} where kind is one of the errdefs kinds
// ("not found", "invalid argument", …, or "internal"); byte strings ([]byte
// fields) are base64 as encoding/json writes them. Streams (exec output,
// followed events) are newline-delimited JSON (Content-Type
// application/x-ndjson): one object per line, flushed as it happens.
//
// May import: nothing of Amber's.
package api

import (
	_ "embed"
	"encoding/json"
	"time"
)

// OpenAPI is the OpenAPI 3 document served at GET /v1/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Error is the body of every failed call.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody names the kind of failure and explains it.
type ErrorBody struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// RequestID names the call in the daemon's log, where an internal
	// error's detail is (its Message is only "internal error").
	RequestID string `json:"request_id,omitempty"`
}

// Limits bound a sandbox's resources; zero means the template's default.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	MilliCPUs   int64 `json:"millicpus,omitempty"` // 1000 is one core
	Pids        int64 `json:"pids,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"` // the writable layer
}

// EgressPolicy is what a sandbox may reach through the egress gateway.
// The zero policy reaches nothing; private, loopback and link-local
// addresses are refused unless the operator named the host.
type EgressPolicy struct {
	// Allow lists destinations as "host:port" patterns: a name,
	// "*.suffix", an IP literal or "*"; a port number or "*".
	Allow []string `json:"allow,omitempty"`
	// RequestsPerSecond and Burst bound HTTP requests and new streams.
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	Burst             int     `json:"burst,omitempty"`
	// BytesPerSecond bounds the egress bandwidth, both directions; 0: none.
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
	// Modes say what happens to a request whose outcome a crash lost:
	// "idempotent-key" (re-sent with the same Idempotency-Key; default for
	// POST, PUT, PATCH, DELETE), "at-most-once" (never re-sent; marked for
	// reconciliation) or "replay-safe" (re-sent; default for GET, HEAD).
	Modes []EgressMode `json:"modes,omitempty"`
	// OnDivergence: "fail" (default) or "forward" a re-run request that
	// differs from the one recorded at its place.
	OnDivergence string `json:"on_divergence,omitempty"`
}

// EgressMode assigns Mode to requests to Dest (a pattern) with Method
// ("" for any).
type EgressMode struct {
	Dest   string `json:"dest"`
	Method string `json:"method,omitempty"`
	Mode   string `json:"mode"`
}

// SandboxEgress is the body of GET /v1/sandboxes/{id}/egress.
type SandboxEgress struct {
	// Policy is the sandbox's own policy (null: it follows its tenant's);
	// Effective is the one in force.
	Policy    *EgressPolicy `json:"policy"`
	Effective EgressPolicy  `json:"effective"`
	// Run is the gateway run its requests are numbered in: its latest cut.
	Run string `json:"run"`
}

// Effect is one outbound request in a sandbox's effect journal.
type Effect struct {
	Key    string `json:"key"`
	Run    string `json:"run"`
	Method string `json:"method"`
	URL    string `json:"url"`
	// State: "done" (an outcome is recorded; a re-run is answered from
	// it), "in-flight" (intent recorded, no outcome yet) or
	// "needs-reconciliation" (an at-most-once request a crash left
	// unknown: it may or may not have happened).
	State       string `json:"state"`
	Status      int    `json:"status,omitempty"`
	Attempts    int    `json:"attempts"`
	Mode        string `json:"mode"`
	Divergences int    `json:"divergences,omitempty"`
	Error       string `json:"error,omitempty"`
	// Seq is the position of its intent in the effects stream.
	Seq uint64 `json:"seq"`
	// Reconciled is the operator's note when the outcome was recorded by a
	// reconciliation (POST …/effects/reconcile), not by the upstream.
	Reconciled string `json:"reconciled,omitempty"`
	// Replays counts the answers served from the journal (a re-run's
	// requests), as the audit trail recorded them.
	Replays int `json:"replays"`
}

// ReconcileRequest is the body of POST /v1/sandboxes/{id}/effects/reconcile:
// the operator's finding about an effect that needs reconciliation. Status
// and Body become its outcome: a re-run of the request is answered with
// them from the journal, the destination is never contacted again.
type ReconcileRequest struct {
	Key    string `json:"key"`
	Status int    `json:"status"`
	Body   string `json:"body,omitempty"`
	Note   string `json:"note"`
}

// SandboxStats is the body of GET /v1/sandboxes/{id}/stats: one reading of
// a running sandbox's resources. CPUNanos is cumulative (it starts again at
// a restore); disk fields are -1 when they could not be read.
type SandboxStats struct {
	Time           time.Time `json:"time"`
	CPUNanos       uint64    `json:"cpu_ns"`
	MemoryBytes    uint64    `json:"memory_bytes"`
	DiskUsedBytes  int64     `json:"disk_used_bytes"`
	DiskTotalBytes int64     `json:"disk_total_bytes"`
}

// TerminalTicket is the answer of POST /v1/sandboxes/{id}/terminal: a
// single-use ticket, valid for a few seconds, to open the sandbox's
// terminal WebSocket at Path ("?ticket=…" included). Browsers cannot send
// an Authorization header on a WebSocket, so the key is checked here and
// the ticket stands for it once.
type TerminalTicket struct {
	Ticket  string    `json:"ticket"`
	Path    string    `json:"path"`
	Expires time.Time `json:"expires"`
}

// EffectList is the body of GET /v1/sandboxes/{id}/effects.
type EffectList struct {
	Effects []Effect `json:"effects"`
	// NeedsReconciliation counts the effects in that state.
	NeedsReconciliation int `json:"needs_reconciliation"`
}

// PutSecretRequest is the body of PUT /v1/secrets/{name}. The value is
// never returned by the API, put in a sandbox, journaled or logged: a
// sandbox holds the placeholder amber-secret://NAME, which the gateway
// replaces in request headers bound for Hosts only.
type PutSecretRequest struct {
	Value string `json:"value"`
	// Hosts are the "host:port" patterns the secret may be sent to.
	Hosts []string `json:"hosts"`
}

// Secret describes a secret (never its value).
type Secret struct {
	Name        string    `json:"name"`
	Placeholder string    `json:"placeholder"`
	Hosts       []string  `json:"hosts"`
	Updated     time.Time `json:"updated"`
}

// SecretList is the body of GET /v1/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// Sandbox describes one sandbox.
type Sandbox struct {
	ID              string   `json:"id"`
	Tenant          string   `json:"tenant"`
	Template        string   `json:"template"`
	TemplateVersion string   `json:"template_version"`
	Driver          string   `json:"driver"`
	State           string   `json:"state"` // creating, running, stopped, crashed, destroyed
	Reason          string   `json:"reason,omitempty"`
	Limits          Limits   `json:"limits"`
	Env             []string `json:"env,omitempty"`
	FromPool        bool     `json:"from_pool"`
	// Generation counts restores in place; Origin is the checkpoint the
	// sandbox was last restored (or forked) from.
	Generation int    `json:"generation"`
	Origin     string `json:"origin,omitempty"`
	// Recovery is the recovery policy ("" is none).
	Recovery string `json:"recovery,omitempty"`
	// Node is the node that runs the sandbox (deployments of many nodes).
	Node string `json:"node,omitempty"`
	// Metadata are its labels; ExpiresAt its deadline (nil: none), and
	// OnTimeout what happens then ("": kill, "pause").
	Metadata  map[string]string `json:"metadata,omitempty"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"`
	Created   time.Time         `json:"created"`
	Updated   time.Time         `json:"updated"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Template describes a template sandboxes can be created from.
type Template struct {
	Name    string   `json:"name"`
	Version string   `json:"version"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	User    string   `json:"user,omitempty"`
	Limits  Limits   `json:"limits"`
	// PoolSize is the number of warm sandboxes kept; PoolReady how many are
	// ready now.
	PoolSize  int `json:"pool_size"`
	PoolReady int `json:"pool_ready"`
}

// TemplateList is the body of GET /v1/templates: the tags (Templates,
// each with the version it names now) and every version on this node or in
// the blob store.
type TemplateList struct {
	Templates []Template        `json:"templates"`
	Versions  []TemplateVersion `json:"versions"`
}

// TemplateVersion is one immutable template version.
type TemplateVersion struct {
	// Digest identifies the content: files, defaults, packages.
	Digest string `json:"digest"`
	// Name is the name it was first added under.
	Name     string            `json:"name"`
	Env      []string          `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	Limits   Limits            `json:"limits"`
	Packages map[string]string `json:"packages,omitempty"`
	// RootFSDigest is the digest of the canonical tar of the files.
	RootFSDigest string    `json:"rootfs_digest,omitempty"`
	Files        int64     `json:"files"`
	Bytes        int64     `json:"bytes"`
	Source       string    `json:"source,omitempty"`
	Created      time.Time `json:"created"`
	// Local: cached on this node; Stored: in the blob store.
	Local  bool `json:"local"`
	Stored bool `json:"stored"`
	// What references it (a referenced version cannot be removed).
	Tags        []string `json:"tags,omitempty"`
	Sandboxes   []string `json:"sandboxes,omitempty"`
	Checkpoints []string `json:"checkpoints,omitempty"`
}

// ImportTemplateResult is the answer of POST /v1/templates/{name}/import.
type ImportTemplateResult struct {
	Version TemplateVersion `json:"version"`
	// Existed: identical content was already a version.
	Existed bool `json:"existed"`
	// Previous is the version the tag named before, if another.
	Previous string `json:"previous,omitempty"`
}

// TagTemplateRequest is the body of PUT /v1/templates/{name}/tag.
type TagTemplateRequest struct {
	// Version: "sha256:<hex>", or another reference ("name@sha256:…").
	Version string `json:"version"`
}

// GCTemplatesResult is the answer of POST /v1/templates/gc.
type GCTemplatesResult struct {
	Removed []string `json:"removed"`
}

// UpgradeSandboxRequest is the body of POST /v1/sandboxes/{id}/upgrade.
type UpgradeSandboxRequest struct {
	// Template: "name", "name@sha256:<hex>" or "sha256:<hex>".
	Template string `json:"template"`
}

// ExecRequest runs a command to completion (POST /v1/sandboxes/{id}/exec
// with Content-Type application/json). The command is Args (argv, no
// shell), or Cmd, a shell command line run by the template's /bin/sh -c
// ("ls -la | wc -l"); exactly one of the two. Stdin, when set, is the
// command's whole input. To stream input instead, send the command as
// query parameters (arg or cmd, env, cwd, tty, timeout_ms) and the input as
// the raw request body (Content-Type application/octet-stream). Env
// entries are KEY=VALUE; none of the strings may hold a NUL byte.
type ExecRequest struct {
	Args      []string `json:"args,omitempty"`
	Cmd       string   `json:"cmd,omitempty"`
	Env       []string `json:"env,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	Stdin     []byte   `json:"stdin,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
}

// ExecFrame is one line of an exec response stream: the command's pid
// ({"pid":…}, when the sandbox reports it), output
// ({"stream":"stdout","data":…}), then exactly one last frame holding Exit
// or Error.
type ExecFrame struct {
	// PID, in a first frame of its own, is the command's sandbox pid
	// (sandboxes with the in-sandbox agent): GET …/processes/{pid}/output
	// re-attaches to its output from an offset if the stream breaks.
	PID    int         `json:"pid,omitempty"`
	Stream string      `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte      `json:"data,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
	Error  *ErrorBody  `json:"error,omitempty"`
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Reason, when the sandbox killed the command: "out of memory (limit
	// 512 MiB)".
	Reason string `json:"reason,omitempty"`
}

// StartProcessRequest starts a background process (POST …/processes):
// Args or Cmd as in ExecRequest. With Stdin its stdin stays open for
// POST …/processes/{pid}/stdin; without, it reads end of file at once.
type StartProcessRequest struct {
	Args  []string `json:"args,omitempty"`
	Cmd   string   `json:"cmd,omitempty"`
	Env   []string `json:"env,omitempty"`
	Cwd   string   `json:"cwd,omitempty"`
	Stdin bool     `json:"stdin,omitempty"`
}

// StartProcessResponse gives the started process's sandbox-side PID.
type StartProcessResponse struct {
	PID int `json:"pid"`
}

// OutputFrame is one line of GET …/processes/{pid}/output: a process's
// output from a byte offset (stdout and stderr counted together, in the
// order the process wrote them), or a marker. A client that keeps the offset
// after the last byte it got re-attaches from there (after a dropped
// connection, a daemon restart, a checkpoint or a restore) and gets each byte
// once. "rewound": the sandbox was restored to a cut older than the offset
// asked for, so the stream goes on from Offset (output the client saw from
// there on was not kept by the restore). "lost": Lost bytes before Offset
// fell out of the process's bounded output ring. "exited" is last (with
// follow) and holds Exit; "error" ends a stream that failed.
type OutputFrame struct {
	Stream string      `json:"stream"` // stdout, stderr, exited, rewound, lost, error
	Offset int64       `json:"offset"`
	Data   []byte      `json:"data,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
	Lost   int64       `json:"lost,omitempty"`
	Error  *ErrorBody  `json:"error,omitempty"`
}

// WatchEvent is one line of GET …/files/watch: a change under the watched
// path, as the sandbox's own kernel saw it. Op is create, write, remove,
// rename or chmod; "overflow" means events were dropped (Path empty).
type WatchEvent struct {
	Path string `json:"path"`
	Op   string `json:"op"`
}

// SignalRequest sends a signal (POST …/processes/{pid}/signal): a name
// ("TERM", "SIGKILL") or a number ("9").
type SignalRequest struct {
	Signal string `json:"signal"`
}

// Process is a process inside a sandbox.
type Process struct {
	PID        int      `json:"pid"`
	PPID       int      `json:"ppid"`
	Args       []string `json:"args"`
	StartTicks uint64   `json:"start_ticks"`
	State      string   `json:"state"`
}

// ProcessList is the body of GET …/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, symlink or other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mtime"`
	Link    string    `json:"link,omitempty"`
}

// FileList is a directory listing (GET …/files?path=DIR).
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// RenameRequest is the body of POST …/files/rename: both paths absolute
// inside the sandbox.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Event is one event of a sandbox's stream in the log.
type Event struct {
	Seq         uint64          `json:"seq"`
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Version     int             `json:"version"`
	Time        time.Time       `json:"time"`
	CausationID string          `json:"causation_id,omitempty"`
	Payload     json.RawMessage `json:"payload"`
}

// EventList is the body of GET …/events (without follow).
type EventList struct {
	Events []Event `json:"events"`
	// Next is the position to read from to continue.
	Next uint64 `json:"next"`
}

// ExposePortRequest exposes a port of a sandbox (POST /v1/sandboxes/{id}/ports).
type ExposePortRequest struct {
	Port int `json:"port"`
}

// PortExposure is an exposed port. URL and Token are returned once, by
// POST /v1/sandboxes/{id}/ports: the daemon keeps only the token's hash.
// The URL, on the port's own origin (http://{port}-{sandbox}.{port
// domain}/?amber_token={token}), proxies HTTP and WebSocket to
// 127.0.0.1:port inside the sandbox; anyone who has it can use it, without
// an API key. Lists give URL as the origin alone. Path is no longer set.
type PortExposure struct {
	SandboxID string    `json:"sandbox_id"`
	Port      int       `json:"port"`
	URL       string    `json:"url,omitempty"`
	Path      string    `json:"path,omitempty"`
	Token     string    `json:"token,omitempty"`
	Created   time.Time `json:"created"`
}

// PortList lists a sandbox's exposed ports (GET /v1/sandboxes/{id}/ports).
type PortList struct {
	Ports []PortExposure `json:"ports"`
}

// CreateCheckpointRequest is the (optional) body of
// POST /v1/sandboxes/{id}/checkpoints.
type CreateCheckpointRequest struct {
	// Tag names the checkpoint and exempts it from retention.
	Tag string `json:"tag,omitempty"`
	// Stop leaves the sandbox stopped once the checkpoint is committed.
	Stop bool `json:"stop,omitempty"`
}

// Checkpoint describes one checkpoint: a consistent cut of a sandbox tied
// to a position (Stream, Seq) of the event log.
type Checkpoint struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	// State: pending, committed, failed or deleted.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Parent string `json:"parent,omitempty"`
	Tag    string `json:"tag,omitempty"`
	// Every event of Stream up to Seq happened before the cut; EventSeq is
	// the sandbox.checkpointed event.
	Stream          string          `json:"stream"`
	Seq             uint64          `json:"seq"`
	EventSeq        uint64          `json:"event_seq,omitempty"`
	Driver          string          `json:"driver"`
	Template        string          `json:"template"`
	TemplateVersion string          `json:"template_version"`
	ManifestDigest  string          `json:"manifest_digest,omitempty"`
	ImageDigest     string          `json:"image_digest,omitempty"`
	Stats           CheckpointStats `json:"stats"`
	Created         time.Time       `json:"created"`
}

// CheckpointStats are a checkpoint's figures.
type CheckpointStats struct {
	FrozenNS    int64 `json:"frozen_ns"`
	DumpNS      int64 `json:"dump_ns"`
	UploadNS    int64 `json:"upload_ns"`
	TotalNS     int64 `json:"total_ns"`
	MemoryBytes int64 `json:"memory_bytes"`
	LayerBytes  int64 `json:"layer_bytes"`
	ImageBytes  int64 `json:"image_bytes"`
	// StoredBytes is what this checkpoint added to the store after
	// deduplication and compression.
	StoredBytes int64 `json:"stored_bytes"`
	Chunks      int   `json:"chunks"`
	NewChunks   int   `json:"new_chunks"`
}

// CheckpointList is the body of GET /v1/sandboxes/{id}/checkpoints.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// RestoreRequest is the (optional) body of POST /v1/checkpoints/{id}/restore.
type RestoreRequest struct {
	// AsNew restores into a new sandbox (a fork); the original is untouched.
	AsNew bool `json:"as_new,omitempty"`
}

// RecoverRequest is the (optional) body of POST /v1/sandboxes/{id}/recover.
type RecoverRequest struct {
	// ToEvent, when set, recovers the state as of that event of the
	// sandbox's stream: the newest checkpoint cut at or before it.
	ToEvent uint64 `json:"to_event,omitempty"`
}

// Progress reports a long operation: its phase ("cut", "upload", "fetch",
// "restore") and bytes done of total for transfers.
type Progress struct {
	Phase string `json:"phase"`
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
}

// OperationFrame is one line of a checkpoint, restore or recover response
// when the client asks for progress (Accept: application/x-ndjson):
// progress frames, then exactly one last frame holding the result
// (Checkpoint or Sandbox) or Error.
type OperationFrame struct {
	Progress   *Progress   `json:"progress,omitempty"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	Sandbox    *Sandbox    `json:"sandbox,omitempty"`
	Error      *ErrorBody  `json:"error,omitempty"`
}

// Tenant is a team sharing the daemon (POST/GET /v1/tenants). Its
// sandboxes, checkpoints and keys are invisible to every other tenant.
type Tenant struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	State   string    `json:"state"` // active
	Created time.Time `json:"created"`
}

// CreateTenantRequest is the body of POST /v1/tenants (the operator's
// admin key only). ID is 1 to 40 of a-z, 0-9 and '-'; Name defaults to it.
type CreateTenantRequest struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
}

// TenantList is the body of GET /v1/tenants: every tenant for the
// operator, the caller's own for a tenant's admin key.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// The scopes an API key can hold.
const (
	ScopeRead  = "read"  // look: list, get, read files, events, wait
	ScopeWrite = "write" // change sandboxes and checkpoints
	ScopeAdmin = "admin" // manage the tenant's keys (the operator's: every tenant)
)

// CreateKeyRequest is the body of POST /v1/tenants/{tenant}/keys.
type CreateKeyRequest struct {
	// Name is unique within the tenant: 1 to 64 of letters, digits, '.',
	// '_' and '-'.
	Name string `json:"name"`
	// Scopes: one or more of read, write, admin.
	Scopes []string `json:"scopes"`
	// ExpiresAt, when set, is when the key stops working; it must be in
	// the future.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// APIKey describes a key. Key, the secret itself, is in the answer to
// POST /v1/tenants/{tenant}/keys only: the daemon keeps its SHA-256 and
// Prefix (its first characters) and can never show it again.
type APIKey struct {
	Name      string     `json:"name"`
	Tenant    string     `json:"tenant"`
	Scopes    []string   `json:"scopes"`
	Prefix    string     `json:"prefix,omitempty"`
	Created   time.Time  `json:"created"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	Key       string     `json:"key,omitempty"`
}

// APIKeyList is the body of GET /v1/tenants/{tenant}/keys.
type APIKeyList struct {
	Keys []APIKey `json:"keys"`
}

// TenantPolicy is a tenant's recovery policy (GET/PUT
// /v1/tenants/{tenant}/policy). Zero fields mean the daemon's defaults.
type TenantPolicy struct {
	// Recovery is the policy of sandboxes created without one: "none",
	// "fast" or "strict".
	Recovery string `json:"recovery,omitempty"`
	// FastEvery, FastIntervalMS: the fast policy checkpoints after N execs or this long after the last.
	FastEvery      int   `json:"fast_every,omitempty"`
	FastIntervalMS int64 `json:"fast_interval_ms,omitempty"`
	// FastReplayBudgetMS: also once the execs since the last one ran this long.
	FastReplayBudgetMS int64 `json:"fast_replay_budget_ms,omitempty"`
	// KeepCheckpoints keeps each sandbox's newest N checkpoints plus tagged
	// ones and truncates its log below them.
	KeepCheckpoints int `json:"keep_checkpoints,omitempty"`
	// IdleTimeoutMS checkpoints and stops a sandbox without calls this
	// long; the next call resumes it.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	// Egress is the egress policy of the tenant's sandboxes that have none
	// of their own (null: the daemon's default), and the most a sandbox's
	// own may reach. It must lie within the operator's ceiling (`amber up
	// --egress-ceiling`; 403 otherwise).
	Egress *EgressPolicy `json:"egress,omitempty"`
}

// AuditRecord is one record of a tenant's audit trail (GET /v1/audit): who
// did what, when, and how it ended; Prev and Hash chain it to the record
// before.
type AuditRecord struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Resource  string    `json:"resource,omitempty"`
	Outcome   string    `json:"outcome"`
	Status    int       `json:"status,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	Detail    string    `json:"detail,omitempty"`
	Prev      string    `json:"prev"`
	Hash      string    `json:"hash"`
}

// AuditList is the body of GET /v1/audit.
type AuditList struct {
	Records []AuditRecord `json:"records"`
}

// AuditReport is the body of GET /v1/audit/verify: whether the tenant's
// chain holds, and if not, the first record that does not.
type AuditReport struct {
	Tenant   string `json:"tenant"`
	OK       bool   `json:"ok"`
	Records  int    `json:"records"`
	First    uint64 `json:"first"`
	Head     uint64 `json:"head"`
	BadSeq   uint64 `json:"bad_seq,omitempty"`
	Problem  string `json:"problem,omitempty"`
	HeadHash string `json:"head_hash,omitempty"`
}

// TenantQuota bounds what a tenant may use (GET/PUT
// /v1/tenants/{tenant}/quota; only the operator sets it). Zero fields mean
// no limit. Exceeding one is 429 naming the quota.
type TenantQuota struct {
	MaxSandboxes       int     `json:"max_sandboxes,omitempty"`
	MaxMemoryBytes     int64   `json:"max_memory_bytes,omitempty"`
	MaxMilliCPUs       int64   `json:"max_millicpus,omitempty"`
	MaxCheckpointBytes int64   `json:"max_checkpoint_bytes,omitempty"`
	RequestsPerSecond  float64 `json:"requests_per_second,omitempty"`
	// Budgets bound what the tenant may consume per calendar month (UTC),
	// by meter (see GET /v1/usage), e.g. {"cpu_seconds": 36000}.
	Budgets map[string]float64 `json:"budgets,omitempty"`
}

// Session is an agent session (GET /v1/sessions/{id}). Its log is served
// by GET /v1/sessions/{id}/events and …/events/stream.
type Session struct {
	ID      string `json:"id"`
	Tenant  string `json:"tenant"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	// Definition is the agent definition the session was created with
	// (the body of POST /v1/sessions, with defaults filled in).
	Definition json.RawMessage `json:"definition"`
	Created    time.Time       `json:"created"`
	Updated    time.Time       `json:"updated"`
}

// SessionList is the body of GET /v1/sessions.
type SessionList struct {
	Sessions []Session `json:"sessions"`
}

// PostSessionEventRequest is a client event for a session (POST
// /v1/sessions/{id}/events). Type is user_message, interrupt,
// tool_confirmation, custom_tool_result, resume or terminate (with or
// without the "session." prefix). ID, when set, makes the post idempotent:
// the same id and content are appended once.
type PostSessionEventRequest struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// UsageReport is the body of GET /v1/usage: a tenant's usage records in
// [from, to) summed per group.
type UsageReport struct {
	Tenant  string     `json:"tenant"`
	From    string     `json:"from,omitempty"`
	To      string     `json:"to,omitempty"`
	GroupBy string     `json:"group_by"`
	Rows    []UsageRow `json:"rows"`
}

// UsageRow is one sum of a UsageReport. Meters: cpu_seconds,
// memory_gib_seconds, egress_requests, egress_bytes, checkpoints, restores,
// checkpoint_storage_gib_hours.
type UsageRow struct {
	Sandbox  string  `json:"sandbox,omitempty"`
	Day      string  `json:"day,omitempty"`
	Meter    string  `json:"meter"`
	Quantity float64 `json:"quantity"`
	Records  int     `json:"records"`
}

// Node is one node of a deployment on shared stores (GET /v1/nodes).
type Node struct {
	ID        string       `json:"id"`
	Addr      string       `json:"addr"`
	Epoch     uint64       `json:"epoch"`
	State     string       `json:"state"` // live, draining, dead, left
	Alive     bool         `json:"alive"` // its lease runs now
	Capacity  NodeCapacity `json:"capacity"`
	Started   time.Time    `json:"started"`
	Heartbeat time.Time    `json:"heartbeat"`
	Expires   time.Time    `json:"expires"`
	TakenBy   string       `json:"taken_by,omitempty"` // the node that took over its sandboxes
}

// NodeCapacity is what a node offers and uses.
type NodeCapacity struct {
	MemoryBytes     int64    `json:"memory_bytes"`
	MaxSandboxes    int      `json:"max_sandboxes"`
	Sandboxes       int      `json:"sandboxes"`
	UsedMemoryBytes int64    `json:"used_memory_bytes"`
	Templates       []string `json:"templates"`
	Driver          string   `json:"driver"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// DrainFrame is the answer of POST /v1/nodes/{id}/drain: without wait, one
// frame (the node marked draining, how many sandboxes it holds); with
// wait=true, newline-delimited frames — that first one, one per sandbox
// moved (Moved), and a last one with Done (the node holds no sandboxes)
// or Error.
type DrainFrame struct {
	Node      string     `json:"node"`
	State     string     `json:"state,omitempty"` // the node's state
	Sandboxes int        `json:"sandboxes"`       // still on the node
	Moved     *DrainMove `json:"moved,omitempty"`
	Done      bool       `json:"done,omitempty"`
	Error     *ErrorBody `json:"error,omitempty"`
}

// DrainMove is one sandbox moved off a draining node.
type DrainMove struct {
	Sandbox    string `json:"sandbox"`
	Tenant     string `json:"tenant"`
	To         string `json:"to"`         // the node it runs on now
	State      string `json:"state"`      // running (stopped and crashed ones move as they are)
	Generation int    `json:"generation"` // one on for a restored sandbox
	Checkpoint string `json:"checkpoint,omitempty"`
	TookMS     int64  `json:"took_ms"` // from its stop on the draining node to running on To
}
