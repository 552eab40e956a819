package server

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
)

// The request decoders of the main creating endpoints, apart from their
// handlers so that FuzzDecodeRequests can feed them arbitrary bytes: each
// returns the request or an error whose kind is a 4xx (invalid argument,
// too large), never a panic. They check what the request itself gets
// wrong, including Limits; what depends on state (does the template
// exist, is the quota free) is the engine's.

func (s *Server) decodeCreateSandbox(r *http.Request) (api.CreateSandboxRequest, error) {
	var req api.CreateSandboxRequest
	if err := readJSON(r, &req); err != nil {
		return req, err
	}
	if req.Timeout < 0 || req.Timeout > int64(engine.MaxTimeout/time.Second) {
		return req, errdefs.InvalidArgumentf("timeout %d: want 0 (none) to %d seconds", req.Timeout, int64(engine.MaxTimeout/time.Second))
	}
	if err := engine.ValidateMetadata(req.Metadata); err != nil {
		return req, err
	}
	if err := s.limits.checkSandbox(fromAPILimits(req.Limits)); err != nil {
		return req, err
	}
	return req, s.limits.checkEnv("sandbox", req.Env)
}

// decodeExec reads an exec request: a JSON ExecRequest body (bounded like
// any JSON body), or the command in query parameters and the raw body as
// streamed stdin (not bounded: it is a stream). A shell command line (Cmd)
// becomes the argv of the template's /bin/sh -c.
func (s *Server) decodeExec(w http.ResponseWriter, r *http.Request) (req api.ExecRequest, stdin io.Reader, streamed bool, err error) {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		s.limitBody(w, r)
	}
	if req, stdin, streamed, err = parseExec(r); err != nil {
		return req, nil, false, err
	}
	if req.Args, err = commandArgs("exec", req.Args, req.Cmd); err != nil {
		return req, nil, false, err
	}
	if err := checkCwd("exec", req.Cwd); err != nil {
		return req, nil, false, err
	}
	return req, stdin, streamed, s.limits.checkCommand("exec", req.Args, req.Env)
}

// shell runs a Cmd: the template's POSIX shell, as a terminal's would.
const shell = "/bin/sh"

// commandArgs is the argv of a request's command: args as given, or cmd,
// a shell command line, as /bin/sh -c cmd. Exactly one of the two.
func commandArgs(what string, args []string, cmd string) ([]string, error) {
	switch {
	case cmd != "" && len(args) > 0:
		return nil, errdefs.InvalidArgumentf("%s: both args and cmd given; args is an argv run as is, cmd a shell command line: send one", what)
	case cmd != "":
		return []string{shell, "-c", cmd}, nil
	case len(args) == 0:
		return nil, errdefs.InvalidArgumentf("%s: no command (args is empty and cmd not given)", what)
	}
	return args, nil
}

func (s *Server) decodeStartProcess(r *http.Request) (api.StartProcessRequest, error) {
	var req api.StartProcessRequest
	if err := readJSON(r, &req); err != nil {
		return req, err
	}
	var err error
	if req.Args, err = commandArgs("process", req.Args, req.Cmd); err != nil {
		return req, err
	}
	if err := checkCwd("process", req.Cwd); err != nil {
		return req, err
	}
	return req, s.limits.checkCommand("process", req.Args, req.Env)
}

func (s *Server) decodeCheckpoint(r *http.Request) (api.CreateCheckpointRequest, error) {
	var req api.CreateCheckpointRequest
	return req, readOptionalJSON(r, &req)
}

func (s *Server) decodeCreateTenant(r *http.Request) (api.CreateTenantRequest, error) {
	var req api.CreateTenantRequest
	if err := readJSON(r, &req); err != nil {
		return req, err
	}
	return req, metadata.ValidTenantID(req.ID)
}

func (s *Server) decodeCreateKey(r *http.Request) (api.CreateKeyRequest, []metadata.Scope, error) {
	var req api.CreateKeyRequest
	if err := readJSON(r, &req); err != nil {
		return req, nil, err
	}
	scopes, err := metadata.ParseScopes(req.Scopes)
	return req, scopes, err
}
