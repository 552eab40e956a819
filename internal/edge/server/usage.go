package server

import (
	"net/http"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
)

// getUsage serves GET /v1/usage: the caller's tenant's usage records (the
// operator's: any tenant's, ?tenant=) whose interval starts in [from, to),
// summed per meter, per sandbox and meter, or per UTC day and meter.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant, err := auditTenant(r, c)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	from, err := usageTime("from", q.Get("from"))
	if err != nil {
		return err
	}
	to, err := usageTime("to", q.Get("to"))
	if err != nil {
		return err
	}
	rows, err := s.eng.Usage(r.Context(), engine.UsageQuery{Tenant: tenant, From: from, To: to, GroupBy: q.Get("group_by")})
	if err != nil {
		return err
	}
	out := api.UsageReport{Tenant: tenant, GroupBy: q.Get("group_by"), Rows: []api.UsageRow{}}
	if out.GroupBy == "" {
		out.GroupBy = "meter"
	}
	if !from.IsZero() {
		out.From = from.Format(time.RFC3339)
	}
	if !to.IsZero() {
		out.To = to.Format(time.RFC3339)
	}
	for _, row := range rows {
		out.Rows = append(out.Rows, api.UsageRow{Sandbox: row.Sandbox, Day: row.Day, Meter: row.Meter, Quantity: row.Quantity, Records: row.Records})
	}
	return writeJSON(w, http.StatusOK, out)
}

// usageTime parses a bound of GET /v1/usage: RFC 3339 or a UTC day.
func usageTime(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", v); err == nil {
		return t, nil
	}
	return time.Time{}, errdefs.InvalidArgumentf("query parameter %s=%.40q is not RFC 3339 or YYYY-MM-DD", name, v)
}
