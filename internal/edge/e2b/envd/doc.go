// Package envd serves E2B's in-sandbox API ("envd") on Amber's engine, so
// that programs written against the official e2b SDK run unchanged: the
// process and filesystem services over connectrpc (the generated code of
// internal/edge/e2b/envdpb), envd's plain HTTP /files and /health.
//
// The SDK reaches envd of sandbox <id> at https://49983-<id>.<domain> (or
// at E2B_SANDBOX_URL, then naming the sandbox in the E2b-Sandbox-Id
// header); Target reads which sandbox a request is for. Handler serves
// every call only after its Authorizer named the tenant that may use that
// sandbox; every engine call then runs as that tenant, so another
// tenant's sandbox is not found.
package envd
