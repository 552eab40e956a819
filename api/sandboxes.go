package api

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Template string   `json:"template"`
	Limits   Limits   `json:"limits,omitempty"`
	Env      []string `json:"env,omitempty"` // KEY=VALUE, added to every process
	// Cold skips the warm pool (to measure a cold create).
	Cold bool `json:"cold,omitempty"`
	// Recovery is the recovery policy: "none" (default: checkpoints on
	// request), "fast" (in the background every few execs or seconds) or
	// "strict" (after every exec, before it is acknowledged).
	Recovery string `json:"recovery,omitempty"`
	// Egress is the sandbox's own egress policy; without it the sandbox
	// follows its tenant's (or the daemon's default). It must lie within
	// its tenant's policy and the operator's ceiling (403 otherwise).
	Egress *EgressPolicy `json:"egress,omitempty"`
	// Metadata are the sandbox's labels (GET /v1/sandboxes?metadata=k=v
	// selects by them). Keys beginning "amber." (in any case) are Amber's
	// own labels: a create with one is a 400 naming it.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Timeout is the seconds until the sandbox's deadline (0: none);
	// OnTimeout what happens then: "kill" (default) or "pause".
	Timeout   int64  `json:"timeout,omitempty"`
	OnTimeout string `json:"on_timeout,omitempty"`
}

// SetTimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout: the
// seconds from now until the new deadline (0: none).
type SetTimeoutRequest struct {
	Timeout int64 `json:"timeout"`
}
