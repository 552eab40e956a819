package envd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/amber-run/amber/internal/edge/e2b/envdpb/process/processconnect"
	"github.com/amber-run/amber/internal/engine"
)

// Port is envd's port in an E2B sandbox: the SDK's host for sandbox <id>
// is Port-<id>.<domain>.
const Port = 49983

// Version is the envd version to report for Amber's sandboxes (the
// control plane's envdVersion): the SDK turns features on by it, and
// this envd has those of 0.5.7 (stdin off by default, closeStdin,
// octet-stream uploads); not file metadata (0.6.2).
const Version = "0.5.7"

// Authorizer decides who may call envd of a sandbox: it returns the
// tenant on whose behalf request r may use sandbox id, or an error of
// errdefs' kinds (ErrUnauthenticated without a valid credential). It need
// not check that the tenant owns id: every call runs as the returned
// tenant, and the engine answers another tenant's sandbox NotFound.
type Authorizer interface {
	Authorize(r *http.Request, sandboxID string) (tenant string, err error)
}

// StreamBeginner is implemented by an Authorizer that also bounds
// long-lived streams (Start, Connect, WatchDir, a watcher): BeginStream
// admits one more of the caller's (r, as authorized for tenant) and
// returns the context it runs in — ended, with a cause of kind
// ErrUnauthenticated, when the caller's credential stops being usable —
// and the func that ends it; an error (ResourceExhausted at a cap)
// refuses the stream. The daemon's server implements it with its own
// streams' cap and key checks.
type StreamBeginner interface {
	BeginStream(ctx context.Context, r *http.Request, tenant string) (context.Context, func(), error)
}

// AuthorizerFunc is a func as an Authorizer.
type AuthorizerFunc func(r *http.Request, sandboxID string) (string, error)

// Authorize calls f.
func (f AuthorizerFunc) Authorize(r *http.Request, id string) (string, error) { return f(r, id) }

// Keys is what KeyAuthorizer reads of the metadata store.
type Keys interface {
	KeyByHash(ctx context.Context, hash string) (metadata.APIKey, error)
}

// KeyAuthorizer authorizes by an Amber API key with write scope, sent as
// the SDK sends envd's access token (X-Access-Token: the control plane
// hands the caller's key out as the sandbox's envdAccessToken) or as a
// Bearer Authorization. envd's own Authorization header holds the
// sandbox user as Basic "<user>:" and is not a credential.
func KeyAuthorizer(keys Keys, clk clock.Clock) Authorizer {
	if clk == nil {
		clk = clock.Real{}
	}
	return AuthorizerFunc(func(r *http.Request, _ string) (string, error) {
		token := strings.TrimSpace(r.Header.Get("X-Access-Token"))
		if token == "" {
			if b, ok := bearer(r.Header.Get("Authorization")); ok {
				token = b
			}
		}
		if token == "" {
			return "", fmt.Errorf("missing X-Access-Token (the sandbox's envdAccessToken): %w", errdefs.ErrUnauthenticated)
		}
		k, err := keys.KeyByHash(r.Context(), metadata.HashKey(token))
		if errdefs.IsNotFound(err) {
			return "", fmt.Errorf("the access token is not valid: %w", errdefs.ErrUnauthenticated)
		}
		if err != nil {
			return "", err
		}
		if err := k.Usable(clk.Now()); err != nil {
			return "", err
		}
		if !k.Has(metadata.ScopeWrite) {
			return "", errdefs.PermissionDeniedf("envd needs a key with scope write; key %q of tenant %s has not", k.Name, k.Tenant)
		}
		return k.Tenant, nil
	})
}

func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	tok = strings.TrimSpace(tok)
	return tok, ok && strings.EqualFold(scheme, "Bearer") && tok != ""
}

// Target reads which sandbox, and which of its ports, request r is for:
// the Host Port-<id>.<domain> (or <port>-<id>.<domain> for another port),
// else the E2b-Sandbox-Id and E2b-Sandbox-Port headers that the SDK sends
// with every request (the only naming when E2B_SANDBOX_URL points every
// sandbox at one address). A Host and a header that name different
// sandboxes are an error, as is no sandbox at all.
func Target(r *http.Request) (id string, port int, err error) {
	hid, hport, hostOK := fromHost(r.Host)
	id = strings.TrimSpace(r.Header.Get("E2b-Sandbox-Id"))
	port = Port
	if v := strings.TrimSpace(r.Header.Get("E2b-Sandbox-Port")); v != "" {
		if port, err = strconv.Atoi(v); err != nil || port <= 0 || port > 65535 {
			return "", 0, errdefs.InvalidArgumentf("E2b-Sandbox-Port %q is not a port", v)
		}
	}
	switch {
	case hostOK && id != "" && id != hid:
		return "", 0, errdefs.InvalidArgumentf("the host names sandbox %s, the E2b-Sandbox-Id header %s", hid, id)
	case hostOK:
		return hid, hport, nil
	case id == "":
		return "", 0, errdefs.InvalidArgumentf("no sandbox named: the host is not <port>-<sandbox id>.<domain> and there is no E2b-Sandbox-Id header")
	}
	return id, port, nil
}

// fromHost reads "<port>-<id>.<domain>[:listen port]".
func fromHost(host string) (string, int, bool) {
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return "", 0, false
	}
	p, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !ok || err != nil || port <= 0 || port > 65535 || id == "" {
		return "", 0, false
	}
	return strings.ToLower(id), port, true
}

// IsPath reports whether p is one of envd's paths: its services'
// (/process.Process/…, /filesystem.Filesystem/…), /files or /health.
func IsPath(p string) bool {
	return p == "/files" || p == "/health" ||
		strings.HasPrefix(p, "/"+processconnect.ProcessName+"/") || strings.HasPrefix(p, "/"+filesystemconnect.FilesystemName+"/")
}

// Options configure Handler.
type Options struct {
	Engine *engine.Engine
	Auth   Authorizer
	Logger *slog.Logger
	// MaxUploadBytes bounds a /files upload (0: 1 GiB).
	MaxUploadBytes int64
}

type callKey struct{}

// call is what the middleware learned of a request: the sandbox and the
// tenant it runs as.
type call struct {
	tenant, id string
	r          *http.Request
}

func callOf(ctx context.Context) call {
	c, _ := ctx.Value(callKey{}).(call)
	return c
}

// Handler serves envd for every sandbox: the process and filesystem
// connectrpc services, /files and /health. Each request is authorized
// first (Target, then Options.Auth, then the sandbox is looked up as that
// tenant); a refusal is answered in the request's protocol (a connect
// error for the services, JSON for /files).
func Handler(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxUploadBytes <= 0 {
		o.MaxUploadBytes = 1 << 30
	}
	s := &service{eng: o.Engine, auth: o.Auth, lg: o.Logger, maxUpload: o.MaxUploadBytes, tags: newTags(), watchers: newWatchers()}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s}))
	mux.HandleFunc("GET /files", s.getFile)
	mux.HandleFunc("POST /files", s.postFile)
	mux.HandleFunc("GET /health", s.health)
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := authorize(r, o)
		if err != nil {
			if ew.IsSupported(r) {
				_ = ew.Write(w, r, connectErr(err))
				return
			}
			writeError(w, err)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
	})
}

func authorize(r *http.Request, o Options) (call, error) {
	id, _, err := Target(r)
	if err != nil {
		return call{}, err
	}
	if o.Auth == nil {
		return call{}, fmt.Errorf("envd has no authorizer (daemon bug; refused): %w", errdefs.ErrPermissionDenied)
	}
	tenant, err := o.Auth.Authorize(r, id)
	if err != nil {
		return call{}, err
	}
	if tenant == "" {
		return call{}, fmt.Errorf("the authorizer named no tenant: %w", errdefs.ErrUnauthenticated)
	}
	if _, err := o.Engine.Get(r.Context(), tenant, id); err != nil {
		return call{}, err
	}
	return call{tenant: tenant, id: id, r: r}, nil
}

// service is what the two connect services and the HTTP routes share.
type service struct {
	eng       *engine.Engine
	auth      Authorizer
	lg        *slog.Logger
	maxUpload int64
	tags      *tags
	watchers  *watchers
}

// beginStream admits a long-lived stream of the call in ctx (see
// StreamBeginner); without a StreamBeginner it is ctx, unbounded.
func (s *service) beginStream(ctx context.Context) (context.Context, func(), error) {
	sb, ok := s.auth.(StreamBeginner)
	c := callOf(ctx)
	if !ok || c.r == nil {
		return ctx, func() {}, nil
	}
	sctx, end, err := sb.BeginStream(ctx, c.r, c.tenant)
	if err != nil {
		return nil, nil, connectErr(err)
	}
	return sctx, end, nil
}

// streamEnd is what a stream whose work returned err answers: nothing
// when its context ended because the client went away or its deadline
// came (the end of a stream, not a failure), the cause when its
// credential stopped being usable, else err as a connect error.
func streamEnd(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return connectErr(err)
	}
	if cause := context.Cause(ctx); errors.Is(cause, errdefs.ErrUnauthenticated) {
		return connectErr(cause)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return nil
}

var codes = []struct {
	kind error
	code connect.Code
}{
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
	{errdefs.ErrTooLarge, connect.CodeResourceExhausted},
	{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
	{errdefs.ErrConflict, connect.CodeAborted},
	{errdefs.ErrNotImplemented, connect.CodeUnimplemented},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrFenced, connect.CodeUnavailable},
	{errdefs.ErrDataLoss, connect.CodeDataLoss},
	{context.Canceled, connect.CodeCanceled},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
}

// connectErr is err as a connect error of the code its errdefs kind
// means; an error of no kind is Internal.
func connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	for _, c := range codes {
		if errors.Is(err, c.kind) {
			return connect.NewError(c.code, err)
		}
	}
	return connect.NewError(connect.CodeInternal, err)
}

// keepalive is how often a stream with nothing to say sends a keepalive
// event: the client's Keepalive-Ping-Interval (seconds; the SDK asks for
// 50), else 50 s, at least 1 s.
func keepalive(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		n = 50
	}
	return time.Duration(n) * time.Second
}
