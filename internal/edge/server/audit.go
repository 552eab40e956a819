package server

import (
	"context"
	"github.com/amber-run/amber/lib/httpx"
	"net/http"
	"strconv"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/audit"
)

// record appends the audit record of a call to a write or admin route that
// passed authentication: who (the key), what (the route and the path),
// when, and how it ended (the status, and the error's kind and message).
// Refused calls (403) are recorded too; calls without a valid key (401)
// have no tenant to record them under and are only logged.
func (s *Server) record(r *http.Request, rt Route, c *call, rid string, sw *httpx.StatusWriter, err error) {
	if s.audit == nil || c.tenant == "" {
		return
	}
	rec := audit.Record{Actor: "key:" + c.key.Name, Action: rt.Method + " " + rt.Path, Resource: r.URL.Path,
		Outcome: "ok", Status: sw.Status, RequestID: rid}
	if err != nil {
		rec.Outcome, rec.Detail = errdefs.Kind(err), errBody(err).Message // an internal error's text is the operator's log's
		if rec.Status == 0 {
			rec.Status = errdefs.HTTPStatus(err)
		}
	}
	if len(rec.Detail) > 500 {
		rec.Detail = rec.Detail[:500] + "…"
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if _, aerr := s.audit.Append(ctx, c.tenant, rec); aerr != nil {
		c.lg.ErrorContext(r.Context(), "audit record not written", "action", rec.Action, "err", aerr)
	}
}

// auditTenant is the tenant whose trail a call reads: the caller's, or for
// the operator any (?tenant=).
func auditTenant(r *http.Request, c *call) (string, error) {
	t := r.URL.Query().Get("tenant")
	if t == "" || t == c.tenant {
		return c.tenant, nil
	}
	if !c.operator() {
		return "", errdefs.NotFoundf("tenant %s", t)
	}
	return t, metadata.ValidTenantID(t)
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, c *call) error {
	if s.audit == nil {
		return errdefs.FailedPreconditionf("this daemon keeps no audit trail")
	}
	tenant, err := auditTenant(r, c)
	if err != nil {
		return err
	}
	from, err := queryInt(r, "from", 1)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 1000)
	if err != nil {
		return err
	}
	ents, err := s.audit.List(r.Context(), tenant, uint64(max(from, 1)), int(limit))
	if err != nil {
		return err
	}
	out := api.AuditList{Records: []api.AuditRecord{}}
	for _, e := range ents {
		out.Records = append(out.Records, api.AuditRecord{Seq: e.Seq, Time: e.Time, Actor: e.Actor, Action: e.Action,
			Resource: e.Resource, Outcome: e.Outcome, Status: e.Status, RequestID: e.RequestID, Detail: e.Detail,
			Prev: e.Prev, Hash: e.Hash})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) verifyAudit(w http.ResponseWriter, r *http.Request, c *call) error {
	if s.audit == nil {
		return errdefs.FailedPreconditionf("this daemon keeps no audit trail")
	}
	tenant, err := auditTenant(r, c)
	if err != nil {
		return err
	}
	rep, err := s.audit.Verify(r.Context(), tenant)
	if err != nil {
		return err
	}
	w.Header().Set("X-Audit-OK", strconv.FormatBool(rep.OK))
	return writeJSON(w, http.StatusOK, api.AuditReport{Tenant: tenant, OK: rep.OK, Records: rep.Records, First: rep.First,
		Head: rep.Head, BadSeq: rep.BadSeq, Problem: rep.Problem, HeadHash: rep.HeadHash})
}
