package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/logging"
)

func toAPICheckpoint(c metadata.Checkpoint) api.Checkpoint {
	return api.Checkpoint{
		ID: c.ID, SandboxID: c.SandboxID, State: string(c.State), Reason: c.Reason, Parent: c.Parent, Tag: c.Tag,
		Stream: c.Stream, Seq: c.Seq, EventSeq: c.EventSeq, Driver: c.Driver, Template: c.Template,
		TemplateVersion: c.TemplateVersion, ManifestDigest: c.ManifestDigest, ImageDigest: c.ImageDigest,
		Stats: api.CheckpointStats(c.Stats), Created: c.Created,
	}
}

// readOptionalJSON decodes the body into v unless the body is empty.
func readOptionalJSON(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return readJSON(r, v)
}

// operation runs a long engine call. A client that accepts
// application/x-ndjson gets progress frames (at most ~10 per second) and
// then the result or the error as the last frame; any other gets one JSON
// answer with status ok.
func operation(w http.ResponseWriter, r *http.Request, ok int, run func(progress func(engine.Progress)) (api.OperationFrame, error)) error {
	if !strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") {
		fr, err := run(nil)
		if err != nil {
			return err
		}
		if fr.Checkpoint != nil {
			return writeJSON(w, ok, fr.Checkpoint)
		}
		return writeJSON(w, ok, fr.Sandbox)
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	write := func(fr api.OperationFrame) error {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(fr); err != nil {
			return err
		}
		return rc.Flush()
	}
	var last time.Time
	lastPhase := ""
	fr, err := run(func(p engine.Progress) {
		now := time.Now()
		if p.Phase == lastPhase && now.Sub(last) < 100*time.Millisecond && p.Done != p.Total {
			return
		}
		last, lastPhase = now, p.Phase
		_ = write(api.OperationFrame{Progress: &api.Progress{Phase: p.Phase, Done: p.Done, Total: p.Total}})
	})
	if err != nil {
		eb := errBody(err)
		return write(api.OperationFrame{Error: &eb})
	}
	return write(fr)
}

func (s *Server) createCheckpoint(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := s.decodeCheckpoint(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	return operation(w, r, http.StatusCreated, func(progress func(engine.Progress)) (api.OperationFrame, error) {
		ck, err := s.eng.Checkpoint(r.Context(), engine.CheckpointRequest{
			Tenant: c.tenant, Sandbox: id, Tag: req.Tag, Stop: req.Stop, Progress: progress,
		})
		if err != nil {
			return api.OperationFrame{}, err
		}
		c.lg.InfoContext(r.Context(), "checkpoint committed", logging.CheckpointID, ck.ID)
		out := toAPICheckpoint(ck)
		return api.OperationFrame{Checkpoint: &out}, nil
	})
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request, c *call) error {
	all, err := queryBool(r, "all")
	if err != nil {
		return err
	}
	cks, err := s.eng.ListCheckpoints(r.Context(), c.tenant, r.PathValue("id"), all)
	if err != nil {
		return err
	}
	out := api.CheckpointList{Checkpoints: []api.Checkpoint{}}
	for _, ck := range cks {
		out.Checkpoints = append(out.Checkpoints, toAPICheckpoint(ck))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request, c *call) error {
	ck, err := s.eng.GetCheckpoint(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPICheckpoint(ck))
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.eng.DeleteCheckpoint(r.Context(), c.tenant, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request, c *call) error {
	var req api.RestoreRequest
	if err := readOptionalJSON(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	status := http.StatusOK
	if req.AsNew {
		status = http.StatusCreated
	}
	return operation(w, r, status, func(progress func(engine.Progress)) (api.OperationFrame, error) {
		sb, err := s.eng.Restore(r.Context(), engine.RestoreRequest{Tenant: c.tenant, Checkpoint: id, AsNew: req.AsNew, Progress: progress})
		if err != nil {
			return api.OperationFrame{}, err
		}
		c.lg.InfoContext(r.Context(), "sandbox restored", "restored_into", sb.ID, "as_new", req.AsNew)
		out := toAPISandbox(sb)
		return api.OperationFrame{Sandbox: &out}, nil
	})
}

func (s *Server) recoverSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	var req api.RecoverRequest
	if err := readOptionalJSON(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	return operation(w, r, http.StatusOK, func(progress func(engine.Progress)) (api.OperationFrame, error) {
		sb, err := s.eng.RecoverTo(r.Context(), c.tenant, id, req.ToEvent, progress)
		if err != nil {
			return api.OperationFrame{}, err
		}
		c.lg.InfoContext(r.Context(), "sandbox recovered", "origin", sb.Origin)
		out := toAPISandbox(sb)
		return api.OperationFrame{Sandbox: &out}, nil
	})
}
