package server

import (
	"context"
	"errors"
	"github.com/amber-run/amber/internal/httpx"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/logging"
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

func toAPIExposure(x engine.Exposure) api.PortExposure {
	return api.PortExposure{SandboxID: x.SandboxID, Port: x.Port, Path: x.Path, Token: x.Token, Created: x.Created}
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
	out.URL = s.baseURL(r) + x.Path
	return writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request, c *call) error {
	xs, err := s.eng.Exposures(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := api.PortList{Ports: []api.PortExposure{}}
	for _, x := range xs {
		out.Ports = append(out.Ports, toAPIExposure(x))
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

// proxyPattern serves exposed ports. It is not an API route: the token in
// the path is the credential (no API key), so a browser can open the URL.
const proxyPattern = "/p/{id}/{port}/{token}/"

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

// proxy serves proxyPattern: it checks the token, then forwards the request
// (HTTP, or a WebSocket / any Upgrade: httputil.ReverseProxy switches to a
// byte copy after a 101) to 127.0.0.1:port inside the sandbox. Every
// failure to authorise — unknown sandbox, port not exposed, wrong token —
// is the same 404, so the URL space reveals nothing.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := requestID(r)
	id := r.PathValue("id")
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
		lg.Log(r.Context(), lvl, "proxy request", "method", r.Method, "port", r.PathValue("port"),
			"status", sw.Status, "took", time.Since(start).Round(time.Microsecond))
	}()
	notFound := func() {
		writeError(sw, errdefs.NotFoundf("not found"))
	}
	// Many nodes: the port is served by the node that runs the sandbox
	// (the token goes along in the path; that node checks it).
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
	port, err := pathPort(r)
	if err != nil {
		notFound()
		return
	}
	token := r.PathValue("token")
	tenant, err := s.eng.ResolveExposure(r.Context(), id, port, token)
	if err != nil {
		if errdefs.IsNotFound(err) {
			s.proxies.drop(id, port)
			notFound()
			return
		}
		lg.Error("resolve exposure", "err", err)
		writeError(sw, err)
		return
	}
	prefix := strings.TrimSuffix(engine.ExposurePath(id, port, token), "/")
	target := "127.0.0.1:" + strconv.Itoa(port)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = target
			pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
			pr.Out.URL.RawPath = ""
			if raw := pr.In.URL.RawPath; raw != "" {
				pr.Out.URL.RawPath = strings.TrimPrefix(raw, prefix)
			}
			if pr.Out.URL.Path == "" {
				pr.Out.URL.Path = "/"
			}
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport:     s.proxies.transport(s.eng, proxyKey{tenant, id, port}),
		FlushInterval: -1, // server-sent events and dev-server streams pass at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			lg.Warn("proxy: cannot reach the sandbox's port", "port", port, "err", err)
			writeJSON(w, http.StatusBadGateway, api.Error{Error: api.ErrorBody{Kind: "unavailable",
				Message: "cannot reach port " + strconv.Itoa(port) + " in sandbox " + id + ": " + err.Error()}})
		},
	}
	rp.ServeHTTP(sw, r)
}
