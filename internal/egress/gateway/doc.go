// Package gateway is Amber's egress gateway: every outbound connection of a
// sandbox ends here, outside the sandbox, and every HTTP request goes through
// the effect journal so that nothing the agent did to the outside world is
// done twice after a restore.
//
// # Vocabulary
//
// A cut is a checkpoint, taken or restored from. A run is a sandbox's
// traffic since its latest cut; its id is the cut's id. Request numbering
// restarts at every cut, so a re-run from cut C meets the requests the
// original run sent after C, under the same keys.
//
// A request's Key is (sandbox, run, method, normalized URL, body SHA-256,
// occurrence number among identical requests since the cut). Concurrent
// requests that arrive in a different order on a re-run still match. Its
// slot is (run, method, URL, n-th request to that method and URL): a re-run
// request whose key is unknown but whose slot holds another body diverged.
//
// # Flow of one HTTP request (durability order)
//
//  1. Policy: rate limit and the sandbox's bounds (requests in flight,
//     buffered bytes: Options.MaxRequestsPerSandbox, MaxBufferedPerSandbox);
//     the Host parsed once (an IPv6 zone, or a name no DNS could hold,
//     refused with 400); allowlist on the Host name and the original port;
//     the name resolved by the gateway and the address checked against the
//     denied networks, embedded IPv4 addresses and the host's own addresses
//     (Policy.denyReason); the gateway dials the address it checked
//     (Options.Dial), never the name again.
//  2. Secrets: placeholders (amber-secret://name) in headers are replaced for
//     hosts the secret is bound to; any other placeholder refuses the request.
//  3. Key lookup in the journal: a recorded outcome is replayed, the
//     upstream is not contacted. An intent without outcome follows the
//     destination's Mode. An unknown key at a recorded slot is a divergence
//     (journaled; then forwarded or refused per Policy.OnDivergence).
//  4. Intent appended to the event log, under the writer's lease epoch, and
//     acknowledged durable — before a byte goes upstream. A stale epoch
//     (errdefs.ErrFenced) forwards nothing.
//  5. Forward (with Idempotency-Key in ModeIdempotentKey); read the answer.
//  6. Outcome appended (secrets redacted), then the client is answered.
//
// The three crash points between these steps are failpoints (FPBeforeSend,
// FPAfterSend, FPAfterOutcome); the tests crash at each.
//
// # TLS
//
// With Options.TLS (TenantCAs), TLS from a sandbox is terminated with a
// leaf certificate for the requested server name signed by the tenant's CA
// (installed in the sandbox's trust store), so HTTPS is journaled like HTTP;
// upstream, the gateway verifies the server normally (Options.UpstreamRoots).
// Without it, TLS is a counted stream.
//
// # Wiring
//
// The network plumbing hands each accepted connection of a sandbox to
// ServeConn with its original destination:
//
//	j := gateway.NewJournal(eventStore)
//	gw := gateway.New(gateway.Options{Journal: j, Secrets: secrets, OnDecision: audit})
//	gw.StartRun(ctx, gateway.Run{Tenant: t, Sandbox: sb, ID: checkpointID, Epoch: epoch, Policy: p})
//	go gw.ServeConn(ctx, conn, origDst, sb) // for every accepted connection
//
// StartRun is called at every cut (checkpoint taken, restore) with the lease
// epoch the node holds on Stream(sandbox).
package gateway
