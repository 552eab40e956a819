package server

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/logging"
	"github.com/amber-run/amber/lib/httpx"
)

// Exposed ports are served from their own origin, never from the API's:
//
//	http://<port>-<sandbox>.<port domain>[:<daemon port>]/
//
// (the host-name form E2B's SDK builds: https://{port}-{sandboxID}.{domain}).
// A page served by a sandbox therefore shares neither cookies, nor
// storage (the console keeps its key in sessionStorage), nor service
// workers with the API and the console, nor with another sandbox's port.
// The operator chooses the domain (`amber up --port-domain`, default
// DefaultPortDomain, which browsers resolve to loopback) and points a
// wildcard DNS name (*.DOMAIN) at the daemon or its front.
//
// The exposure's token is the credential, in one of three places:
//
//   - the query parameter amber_token on a first visit (the URL that
//     `amber port expose` prints): the proxy sets it as an HttpOnly,
//     host-only cookie of that port origin and, for a browser's navigation
//     (Sec-Fetch-Mode: navigate), redirects to the same URL without it, so
//     the token leaves the address bar and is never sent as a Referer;
//   - that cookie (portCookie) on every later request of the browser;
//   - the header X-Amber-Port-Token (SDKs, scripts).
//
// The proxy forwards none of them to the sandbox, nor the caller's Amber
// API key (an Authorization that holds one), and drops the sandbox's
// response headers that act beyond its origin or persist in the browser
// (scrubResponse). The old path form /p/SBX/PORT/TOKEN/… on the API's
// origin serves nothing: it redirects to the port origin (legacyPortPath).

// DefaultPortDomain is the port domain of a daemon whose Options name
// none: browsers resolve every *.localhost name to loopback.
const DefaultPortDomain = "ports.localhost"

const (
	portTokenQuery  = "amber_token"
	portTokenHeader = "X-Amber-Port-Token"
	portCookie      = "amber_port_token"
)

func pathPort(r *http.Request) (int, error) {
	v := r.PathValue("port")
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		return 0, errdefs.InvalidArgumentf("port %.20q is not in 1..65535", v)
	}
	return p, nil
}

// baseURL is where clients reach the daemon: Options.PublicURL, else the
// scheme and Host of the request.
func (s *Server) baseURL(r *http.Request) string {
	if s.publicURL != "" {
		return strings.TrimRight(s.publicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// portOrigin is the origin that serves port of sandbox id: the scheme and
// the port of baseURL, on host <port>-<id>.<port domain>.
func (s *Server) portOrigin(r *http.Request, id string, port int) string {
	scheme, hostport := "http", r.Host
	if u, err := url.Parse(s.baseURL(r)); err == nil && u.Host != "" {
		scheme, hostport = u.Scheme, u.Host
	}
	host := strconv.Itoa(port) + "-" + id + "." + s.portDomain
	if _, p, err := net.SplitHostPort(hostport); err == nil && p != "" {
		host = net.JoinHostPort(host, p)
	}
	return scheme + "://" + host
}

// portURL is the URL that opens an exposure: its origin, with the token.
func (s *Server) portURL(r *http.Request, id string, port int, token string) string {
	return s.portOrigin(r, id, port) + "/?" + portTokenQuery + "=" + url.QueryEscape(token)
}

// parsePortHost reads a Host header of the port domain: ok is false when
// host is not under it; port is 0 when it is, but names no port of a
// sandbox (which is answered 404 like any unknown exposure).
func parsePortHost(host, domain string) (id string, port int, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, under := strings.CutSuffix(host, "."+domain)
	if !under {
		return "", 0, host == domain
	}
	ps, id, found := strings.Cut(label, "-")
	p, err := strconv.Atoi(ps)
	if !found || err != nil || p < 1 || p > 65535 || ps != strconv.Itoa(p) || !portHostID(id) {
		return "", 0, true
	}
	return id, p, true
}

// portHostID reports whether id can be a sandbox id in a host name: the
// engine's ids are [a-z0-9-], at most 48 bytes.
func portHostID(id string) bool {
	return id != "" && len(id) <= 48 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

func toAPIExposure(x engine.Exposure) api.PortExposure {
	return api.PortExposure{SandboxID: x.SandboxID, Port: x.Port, Token: x.Token, Created: x.Created}
}

func (s *Server) exposePort(w http.ResponseWriter, r *http.Request, c *call) error {
	var req api.ExposePortRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	x, err := s.eng.Expose(r.Context(), c.tenant, r.PathValue("id"), req.Port)
	if err != nil {
		return err
	}
	out := toAPIExposure(x)
	out.URL = s.portURL(r, x.SandboxID, x.Port, x.Token)
	return writeJSON(w, http.StatusCreated, out)
}

// listPorts lists the exposures with their origins (without tokens: the
// daemon does not know them).
func (s *Server) listPorts(w http.ResponseWriter, r *http.Request, c *call) error {
	xs, err := s.eng.Exposures(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := api.PortList{Ports: []api.PortExposure{}}
	for _, x := range xs {
		p := toAPIExposure(x)
		p.URL = s.portOrigin(r, x.SandboxID, x.Port) + "/"
		out.Ports = append(out.Ports, p)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) unexposePort(w http.ResponseWriter, r *http.Request, c *call) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.eng.Unexpose(r.Context(), c.tenant, id, port); err != nil {
		return err
	}
	s.proxies.drop(id, port)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// proxyPattern is the old path form of exposed ports, on the API's origin.
// It serves no sandbox content any more (legacyPortPath).
const proxyPattern = "/p/{id}/{port}/{token}/"

// legacyPortPath answers the old path form /p/SBX/PORT/TOKEN/REST with a
// permanent redirect to REST on the port's origin, the token in the query.
// It looks nothing up (the same answer for any sandbox, port and token), so
// it tells nobody what exists.
func (s *Server) legacyPortPath(w http.ResponseWriter, r *http.Request) {
	port, err := pathPort(r)
	if err != nil || !portHostID(r.PathValue("id")) {
		writeError(w, errdefs.NotFoundf("not found"))
		return
	}
	id, token := r.PathValue("id"), r.PathValue("token")
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/p/"+id+"/"+strconv.Itoa(port)+"/"+url.PathEscape(token))
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	q := r.URL.Query()
	q.Set(portTokenQuery, token)
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, s.portOrigin(r, id, port)+rest+"?"+q.Encode(), http.StatusPermanentRedirect)
}

// proxies keeps one http.Transport per exposed port, so that connections
// into the sandbox are reused across requests (a dial into a gVisor
// sandbox costs a runsc invocation).
type proxies struct {
	mu sync.Mutex
	m  map[proxyKey]*http.Transport
}

type proxyKey struct {
	tenant, id string
	port       int
}

func (p *proxies) transport(eng *engine.Engine, k proxyKey) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.m[k]; ok {
		return t
	}
	if p.m == nil {
		p.m = map[proxyKey]*http.Transport{}
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return eng.DialPort(ctx, k.tenant, k.id, k.port)
		},
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	p.m[k] = t
	return t
}

// drop forgets the transports of sandbox id's port (any tenant) and closes
// their idle connections.
func (p *proxies) drop(id string, port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, t := range p.m {
		if k.id == id && k.port == port {
			t.CloseIdleConnections()
			delete(p.m, k)
		}
	}
}

// servePortHost serves r when its Host is under the port domain (and
// reports whether it was): the API is never served there.
func (s *Server) servePortHost(w http.ResponseWriter, r *http.Request) bool {
	id, port, ok := parsePortHost(r.Host, s.portDomain)
	if !ok {
		return false
	}
	s.proxy(w, r, id, port)
	return true
}

// portTokens returns the tokens r offers, in the order they are tried.
func portTokens(r *http.Request) (tokens []string, fromQuery bool) {
	if t := r.Header.Get(portTokenHeader); t != "" {
		return []string{t}, false
	}
	if t := r.URL.Query().Get(portTokenQuery); t != "" {
		return []string{t}, true
	}
	for _, c := range r.Cookies() {
		if c.Name == portCookie && c.Value != "" && len(tokens) < 4 {
			tokens = append(tokens, c.Value)
		}
	}
	return tokens, false
}

// proxy serves port of sandbox id on its origin: it checks the token, then
// forwards the request (HTTP, or a WebSocket / any Upgrade:
// httputil.ReverseProxy switches to a byte copy after a 101) to
// 127.0.0.1:port inside the sandbox. Every failure to authorise — unknown
// sandbox, another tenant's, port not exposed, wrong or no token — is the
// same 404, so the host names reveal nothing.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port int) {
	start := time.Now()
	rid := requestID(r)
	sw := &httpx.StatusWriter{ResponseWriter: w}
	lg := s.lg.With(logging.RequestID, rid, logging.SandboxID, id)
	defer func() {
		if sw.Status == 0 && r.Header.Get("Upgrade") != "" {
			// ReverseProxy writes a 101 on the hijacked connection.
			sw.Status = http.StatusSwitchingProtocols
		}
		lvl := slog.LevelInfo
		if sw.Status >= 500 {
			lvl = slog.LevelWarn
		}
		// The token is the credential: it is not logged.
		lg.Log(r.Context(), lvl, "proxy request", "method", r.Method, "port", port,
			"status", sw.Status, "took", time.Since(start).Round(time.Microsecond))
	}()
	notFound := func() {
		writeError(sw, errdefs.NotFoundf("not found"))
	}
	if port == 0 {
		notFound()
		return
	}
	// Many nodes: the port is served by the node that runs the sandbox
	// (Host and token go along; that node checks the token).
	if s.router != nil && r.Header.Get(forwardedHeader) == "" {
		addr, err := s.router.Owner(r.Context(), id)
		if err != nil {
			writeError(sw, errdefs.Unavailablef("the node behind this URL is down; retry"))
			return
		}
		if addr != "" {
			s.forwardTo(sw, r, addr)
			return
		}
	}
	tokens, fromQuery := portTokens(r)
	var tenant, token string
	for _, t := range tokens {
		tn, err := s.eng.ResolveExposure(r.Context(), id, port, t)
		if err == nil {
			tenant, token = tn, t
			break
		}
		if !errdefs.IsNotFound(err) {
			lg.Error("resolve exposure", "err", err)
			writeError(sw, err)
			return
		}
	}
	if tenant == "" && len(tokens) == 0 {
		// A sandbox whose ports are public (E2B's): no token needed.
		if tn, err := s.eng.PublicPorts(r.Context(), id, port); err == nil {
			tenant = tn
		} else if !errdefs.IsNotFound(err) {
			writeError(sw, err)
			return
		}
	}
	if tenant == "" {
		s.proxies.drop(id, port)
		notFound()
		return
	}
	if fromQuery {
		http.SetCookie(sw, &http.Cookie{Name: portCookie, Value: token, Path: "/", HttpOnly: true,
			Secure: strings.HasPrefix(s.portOrigin(r, id, port), "https:"), SameSite: http.SameSiteLaxMode})
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Sec-Fetch-Mode") == "navigate" {
			u := *r.URL
			q := u.Query()
			q.Del(portTokenQuery)
			u.RawQuery = q.Encode()
			sw.Header().Set("Cache-Control", "no-store")
			sw.Header().Set("Referrer-Policy", "no-referrer")
			http.Redirect(sw, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
	}
	target := "127.0.0.1:" + strconv.Itoa(port)
	amberKey := s.isAmberCredential(r.Context(), r.Header.Get("Authorization"))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = target // dev servers check Host; X-Forwarded-Host has the origin's
			if q := pr.Out.URL.Query(); q.Has(portTokenQuery) {
				q.Del(portTokenQuery)
				pr.Out.URL.RawQuery = q.Encode()
			}
			pr.SetXForwarded()
			scrubRequest(pr.Out.Header, amberKey)
		},
		ModifyResponse: func(resp *http.Response) error {
			scrubResponse(resp.Header)
			return nil
		},
		Transport:     s.proxies.transport(s.eng, proxyKey{tenant, id, port}),
		FlushInterval: -1, // server-sent events and dev-server streams pass at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			lg.Warn("proxy: cannot reach the sandbox's port", "port", port, "err", err)
			writeJSON(w, http.StatusBadGateway, api.Error{Error: api.ErrorBody{Kind: "unavailable",
				Message: "cannot reach port " + strconv.Itoa(port) + " in sandbox " + id + " (is a server listening on 127.0.0.1:" + strconv.Itoa(port) + "?)"}})
		},
	}
	rp.ServeHTTP(sw, r)
}

// isAmberCredential reports whether an Authorization header carries an
// Amber API key: a Bearer or Basic credential holding a secret of
// metadata.NewKeySecret's form, or one whose hash is a key in the store.
func (s *Server) isAmberCredential(ctx context.Context, h string) bool {
	if h == "" {
		return false
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(h), " ")
	cred = strings.TrimSpace(cred)
	parts := []string{cred}
	if strings.EqualFold(scheme, "Basic") {
		if b, err := base64.StdEncoding.DecodeString(cred); err == nil {
			u, p, _ := strings.Cut(string(b), ":")
			parts = []string{u, p}
		}
	}
	for _, p := range parts {
		if strings.HasPrefix(p, "amber_") {
			return true
		}
		if p == "" || len(p) > 512 {
			continue
		}
		if _, err := s.meta.KeyByHash(ctx, metadata.HashKey(p)); err == nil {
			return true
		}
	}
	return false
}

// scrubRequest removes from a request to a sandbox what it must not see:
// the exposure's token (header and cookie), the caller's Amber key, and
// the nodes' own forwarding mark.
func scrubRequest(h http.Header, amberKey bool) {
	h.Del(portTokenHeader)
	h.Del(forwardedHeader)
	if amberKey {
		h.Del("Authorization")
	}
	var keep []string
	for _, line := range h.Values("Cookie") {
		for _, part := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
			if name != "" && name != portCookie {
				keep = append(keep, strings.TrimSpace(part))
			}
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// droppedResponseHeaders act beyond the response's own origin or persist
// in the browser past the exposure: a service worker's wider scope,
// clearing site data, HSTS (which on a shared parent domain reaches other
// hosts with includeSubDomains), key pins, alternative services.
var droppedResponseHeaders = []string{
	"Service-Worker-Allowed", "Clear-Site-Data", "Strict-Transport-Security",
	"Public-Key-Pins", "Public-Key-Pins-Report-Only", "Alt-Svc", "Expect-CT",
}

// scrubResponse makes a sandbox's response safe to serve on its port
// origin: it keeps only host-only cookies (a Domain attribute would reach
// the API's or another port's host under a shared parent domain), never
// the proxy's own token cookie, drops droppedResponseHeaders, and isolates
// the page's browsing context from the window that opened it (COOP
// same-origin: a page opened from the console cannot reach window.opener).
func scrubResponse(h http.Header) {
	var cookies []string
	for _, line := range h.Values("Set-Cookie") {
		if c, err := http.ParseSetCookie(line); err == nil && c.Domain == "" && c.Name != portCookie && !strings.Contains(strings.ToLower(line), "domain=") {
			cookies = append(cookies, line)
		}
	}
	h.Del("Set-Cookie")
	for _, c := range cookies {
		h.Add("Set-Cookie", c)
	}
	for _, k := range droppedResponseHeaders {
		h.Del(k)
	}
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// portDomainOrDefault normalises the operator's port domain (lower case,
// no dots around it); empty is DefaultPortDomain.
func portDomainOrDefault(d string) string {
	d = strings.Trim(strings.ToLower(strings.TrimSpace(d)), ".")
	if d == "" {
		return DefaultPortDomain
	}
	return d
}
