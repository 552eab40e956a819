// Package client is the Go SDK for Amber's REST API (see api/openapi.json).
// The amber CLI is built on it.
//
//	c, _ := client.New("127.0.0.1:7777", token)
//	sb, _ := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "python"})
//	st, _ := c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"python3", "-c", "print(6*7)"}}, nil, os.Stdout, os.Stderr)
//
// Errors returned for API failures are *Error values; errors.Is(err,
// errdefs.ErrNotFound) and the other errdefs kinds work on them.
//
// May import: api, core.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
)

// Client talks to one Amber daemon. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	// HTTP is the underlying client; replace it to set timeouts or transport.
	HTTP *http.Client
	// Retry is how long a call that is safe to repeat — a GET or HEAD, or
	// a call carrying an Idempotency-Key — is tried again while the daemon
	// cannot be reached (restarting) or answers 503 Unavailable (e.g. the
	// sandbox's node is down and it is being restored on another), with
	// backoff from 100 ms doubling to 2 s. 0 (the default): never retried.
	// A call that is not safe to repeat (an exec, a create without a key)
	// is never retried.
	Retry time.Duration
}

// New returns a client for the daemon at addr ("host:port" or a URL)
// authenticating with token.
func New(addr, token string) (*Client, error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return nil, errdefs.InvalidArgumentf("daemon address %q is not host:port or a URL", addr)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return &Client{base: u, token: token, HTTP: &http.Client{}}, nil
}

// Error is a failed API call.
type Error struct {
	Status  int
	Kind    string
	Message string
}

func (e *Error) Error() string { return e.Message }

var kinds = []error{
	errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument, errdefs.ErrConflict,
	errdefs.ErrFenced, errdefs.ErrCompacted, errdefs.ErrUnavailable, errdefs.ErrDataLoss,
	errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated, errdefs.ErrResourceExhausted,
	errdefs.ErrFailedPrecondition, errdefs.ErrNotImplemented, errdefs.ErrTooLarge,
}

// Unwrap returns the errdefs kind the server named, so errors.Is works.
func (e *Error) Unwrap() error {
	for _, k := range kinds {
		if k.Error() == e.Kind {
			return k
		}
	}
	return nil
}

func fromBody(eb api.ErrorBody, status int) *Error {
	return &Error{Status: status, Kind: eb.Kind, Message: eb.Message}
}

// fromFrame is the error of a stream's error frame, sent after the 200:
// its Status is the one its kind has as a plain answer (errdefs.HTTPStatus).
func fromFrame(eb api.ErrorBody) *Error {
	e := &Error{Kind: eb.Kind, Message: eb.Message}
	e.Status = errdefs.HTTPStatus(e)
	return e
}

// request builds a request to path (relative to the base) with query q.
func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Request, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	return req, nil
}

// send performs req, tried again within c.Retry when that is safe (see
// Retry), and turns a non-2xx answer into an *Error.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	retry := c.Retry > 0 && (req.Method == http.MethodGet || req.Method == http.MethodHead || req.Header.Get("Idempotency-Key") != "") &&
		(req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
	deadline := time.Now().Add(c.Retry)
	delay := 100 * time.Millisecond
	for {
		resp, err := c.send1(req)
		left := time.Until(deadline)
		if !retry || !errors.Is(err, errdefs.ErrUnavailable) || left <= 0 {
			return resp, err
		}
		select {
		case <-req.Context().Done():
			return nil, err
		case <-time.After(min(delay, left)):
		}
		delay = min(2*delay, 2*time.Second)
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}

func (c *Client) send1(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w (is `amber up` running there?)", req.Method, req.URL.Redacted(), errors.Join(err, errdefs.ErrUnavailable))
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e api.Error
	if json.Unmarshal(b, &e) != nil || e.Error.Kind == "" {
		return nil, &Error{Status: resp.StatusCode, Kind: "internal", Message: fmt.Sprintf("%s %s: HTTP %d: %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(b))}
	}
	return nil, fromBody(e.Error, resp.StatusCode)
}

// do sends a JSON request (in may be nil) and decodes a JSON answer into out
// (which may be nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	req, err := c.request(ctx, method, path, q, body, ctype)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func sbPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Health checks that the daemon answers (no key needed).
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, "GET", "/healthz", nil, nil, nil)
}

// Info returns the daemon's version, driver and the caller's tenant.
func (c *Client) Info(ctx context.Context) (api.Info, error) {
	var out api.Info
	return out, c.do(ctx, "GET", "/v1/info", nil, nil, &out)
}

// Templates lists the templates.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var out api.TemplateList
	return out.Templates, c.do(ctx, "GET", "/v1/templates", nil, nil, &out)
}

// CreateSandbox creates a sandbox and returns it running.
func (c *Client) CreateSandbox(ctx context.Context, r api.CreateSandboxRequest) (api.Sandbox, error) {
	var out api.Sandbox
	return out, c.do(ctx, "POST", "/v1/sandboxes", nil, r, &out)
}

// ListSandboxes lists the caller's sandboxes.
func (c *Client) ListSandboxes(ctx context.Context) ([]api.Sandbox, error) {
	var out api.SandboxList
	return out.Sandboxes, c.do(ctx, "GET", "/v1/sandboxes", nil, nil, &out)
}

// ListFilter selects sandboxes for FindSandboxes: by state (empty: every
// state but destroyed) and by metadata (every pair must match).
type ListFilter struct {
	States   []string
	Metadata map[string]string
}

// FindSandboxes lists the caller's sandboxes that match f.
func (c *Client) FindSandboxes(ctx context.Context, f ListFilter) ([]api.Sandbox, error) {
	q := url.Values{}
	for _, st := range f.States {
		q.Add("state", st)
	}
	for k, v := range f.Metadata {
		q.Add("metadata", k+"="+v)
	}
	var out api.SandboxList
	return out.Sandboxes, c.do(ctx, "GET", "/v1/sandboxes", q, nil, &out)
}

// SetTimeout sets a sandbox's deadline to seconds from now (0: none).
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int64) (api.Sandbox, error) {
	var out api.Sandbox
	return out, c.do(ctx, "POST", sbPath(id, "/timeout"), nil, api.SetTimeoutRequest{Timeout: seconds}, &out)
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var out api.Sandbox
	return out, c.do(ctx, "GET", sbPath(id), nil, nil, &out)
}

// DeleteSandbox destroys a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", sbPath(id), nil, nil, nil)
}

// KillSandbox SIGKILLs every process of a sandbox.
func (c *Client) KillSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var out api.Sandbox
	return out, c.do(ctx, "POST", sbPath(id, "/kill"), nil, nil, &out)
}

// Events returns a sandbox's lifecycle events from position from.
func (c *Client) Events(ctx context.Context, id string, from uint64, limit int) (api.EventList, error) {
	var out api.EventList
	q := url.Values{"from": {fmt.Sprint(from)}}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	return out, c.do(ctx, "GET", sbPath(id, "/events"), q, nil, &out)
}
