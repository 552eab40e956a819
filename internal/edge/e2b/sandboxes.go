package e2b

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/edge/e2b/envd"
	"github.com/amber-run/amber/internal/engine"
)

var errEOF = io.EOF

// amberKeys begins the metadata keys Amber keeps for itself (hidden from
// E2B's answers).
const amberKeys = "amber/"

// newSandbox is the body of POST /v2/sandboxes (the fields Amber uses;
// others the SDK sends are ignored).
type newSandbox struct {
	TemplateID string `json:"templateID"`
	Network    *struct {
		AllowPublicTraffic *bool `json:"allowPublicTraffic"`
	} `json:"network"`
	Timeout   *int64            `json:"timeout"`
	AutoPause bool              `json:"autoPause"`
	Metadata  map[string]string `json:"metadata"`
	EnvVars   map[string]string `json:"envVars"`
}

// sandboxOut is E2B's Sandbox (create, connect).
type sandboxOut struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain,omitempty"`
}

// detail is E2B's SandboxDetail (get) and ListedSandbox (list).
type detail struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int64             `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          string            `json:"domain,omitempty"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// state is sb's E2B state: "running", "paused", or "" (gone to E2B:
// killed, crashed, destroyed).
func state(sb metadata.Sandbox) string {
	switch {
	case sb.State == metadata.StateRunning || sb.State == metadata.StateCreating || sb.State == metadata.StateRestoring:
		return "running"
	case engine.Paused(sb):
		return "paused"
	}
	return ""
}

func (h *handler) template(name string) string {
	if t, ok := h.o.Templates[name]; ok {
		return t
	}
	if name == "base" || name == "" {
		if _, err := h.o.Engine.Templates().Get("python"); err == nil {
			return "python"
		}
		return "minimal"
	}
	return name
}

func (h *handler) out(c call, sb metadata.Sandbox, template string) sandboxOut {
	return sandboxOut{TemplateID: template, SandboxID: sb.ID, ClientID: "amber", EnvdVersion: envd.Version,
		EnvdAccessToken: c.key, Domain: h.o.Domain}
}

func (h *handler) detail(sb metadata.Sandbox) detail {
	d := detail{TemplateID: sb.Template, SandboxID: sb.ID, ClientID: "amber", StartedAt: sb.Created, EndAt: sb.Expires,
		CPUCount: max(sb.Limits.MilliCPUs/1000, 1), MemoryMB: sb.Limits.MemoryBytes >> 20, DiskSizeMB: sb.Limits.DiskBytes >> 20,
		Metadata: sb.Metadata, State: state(sb), EnvdVersion: envd.Version, Domain: h.o.Domain,
		Lifecycle: &lifecycle{OnTimeout: "kill"}}
	d.Metadata = map[string]string{}
	for k, v := range sb.Metadata {
		if !strings.HasPrefix(k, amberKeys) {
			d.Metadata[k] = v
		}
	}
	if sb.OnExpire == metadata.ExpirePause {
		d.Lifecycle.OnTimeout = "pause"
	}
	if d.EndAt.IsZero() {
		d.EndAt = sb.Created.Add(engine.MaxTimeout)
	}
	return d
}

func timeoutOf(secs *int64) (time.Duration, error) {
	if secs == nil {
		return DefaultTimeout, nil
	}
	if *secs < 0 || *secs > int64(engine.MaxTimeout/time.Second) {
		return 0, errdefs.InvalidArgumentf("timeout %d: want 0 to %d seconds", *secs, int64(engine.MaxTimeout/time.Second))
	}
	return time.Duration(*secs) * time.Second, nil
}

func (h *handler) create(w http.ResponseWriter, r *http.Request, c call) error {
	var req newSandbox
	if err := readBody(r, &req); err != nil {
		return err
	}
	d, err := timeoutOf(req.Timeout)
	if err != nil {
		return err
	}
	env := make([]string, 0, len(req.EnvVars))
	for k, v := range req.EnvVars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	// The caller's metadata, before Amber adds its own: keys of Amber's
	// labels ("amber." in any case, engine.ReservedLabel) and of Amber's
	// E2B switches ("amber/") are refused.
	if err := engine.ValidateMetadata(req.Metadata); err != nil {
		return err
	}
	md := map[string]string{}
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, amberKeys) {
			return errdefs.InvalidArgumentf("metadata key %.40q: keys beginning %s are Amber's", k, amberKeys)
		}
		md[k] = v
	}
	if req.Network == nil || req.Network.AllowPublicTraffic == nil || *req.Network.AllowPublicTraffic {
		md[engine.PublicPortsKey] = "true" // E2B's default: getHost(port) needs no token
	}
	cr := engine.CreateRequest{Tenant: c.tenant, Template: h.template(req.TemplateID), Env: env, Metadata: md, Timeout: d}
	cr.OnTimeout = metadata.ExpireDestroy // E2B's kill: nothing is left
	if req.AutoPause {
		cr.OnTimeout = metadata.ExpirePause
	}
	sb, err := h.o.Engine.Create(r.Context(), cr)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.out(c, sb, req.TemplateID))
	return nil
}

// find returns c's sandbox id if it exists for E2B (state not "").
func (h *handler) find(r *http.Request, c call) (metadata.Sandbox, error) {
	sb, err := h.o.Engine.Get(r.Context(), c.tenant, r.PathValue("id"))
	if errdefs.IsInvalidArgument(err) {
		return sb, errdefs.NotFoundf("sandbox %.60q not found", r.PathValue("id"))
	}
	if err != nil {
		return sb, err
	}
	if state(sb) == "" {
		return sb, errdefs.NotFoundf("sandbox %s not found (it is %s: %s)", sb.ID, sb.State, sb.Reason)
	}
	return sb, nil
}

func (h *handler) get(w http.ResponseWriter, r *http.Request, c call) error {
	sb, err := h.find(r, c)
	if err != nil {
		return err
	}
	d := h.detail(sb)
	d.EnvdAccessToken = c.key
	writeJSON(w, http.StatusOK, d)
	return nil
}

// list serves GET /v2/sandboxes: metadata (a query string of pairs, as
// the SDK encodes it), state (running, paused; comma-separated or
// repeated; default both), limit and nextToken (the last id of the
// previous page), oldest first.
func (h *handler) list(w http.ResponseWriter, r *http.Request, c call) error {
	q := r.URL.Query()
	md := map[string]string{}
	for _, m := range q["metadata"] {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return errdefs.InvalidArgumentf("metadata %.60q: %v", m, err)
		}
		for k, vs := range pairs {
			k, _ = url.QueryUnescape(k)
			v, _ := url.QueryUnescape(vs[len(vs)-1])
			md[k] = v
		}
	}
	want := map[string]bool{}
	for _, s := range q["state"] {
		for _, st := range strings.Split(s, ",") {
			switch st = strings.TrimSpace(st); st {
			case "running", "paused":
				want[st] = true
			case "":
			default:
				return errdefs.InvalidArgumentf("state %.40q: want running or paused", st)
			}
		}
	}
	if len(want) == 0 {
		want = map[string]bool{"running": true, "paused": true}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.InvalidArgumentf("limit %.20q: want 1 to 1000", v)
		}
		limit = n
	}
	rows, err := h.o.Engine.Find(r.Context(), c.tenant, engine.ListFilter{Metadata: md})
	if err != nil {
		return err
	}
	after := q.Get("nextToken")
	out := []detail{}
	for _, sb := range rows {
		if after != "" {
			if sb.ID == after {
				after = ""
			}
			continue
		}
		if !want[state(sb)] {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SandboxID)
			break
		}
		out = append(out, h.detail(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) kill(w http.ResponseWriter, r *http.Request, c call) error {
	sb, err := h.o.Engine.Get(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil || sb.State == metadata.StateDestroyed {
		if err == nil || errdefs.IsInvalidArgument(err) {
			err = errdefs.NotFoundf("sandbox %.60q not found", r.PathValue("id"))
		}
		return err
	}
	if err := h.o.Engine.Destroy(r.Context(), c.tenant, sb.ID); err != nil {
		return err
	}
	if state(sb) == "" {
		// Gone to E2B already (killed at its deadline): its remains are
		// destroyed, and the answer is E2B's, not found.
		return errdefs.NotFoundf("sandbox %s not found (it was %s: %s)", sb.ID, sb.State, sb.Reason)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) setTimeout(w http.ResponseWriter, r *http.Request, c call) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := readBody(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return errdefs.InvalidArgumentf("timeout is required (seconds)")
	}
	return h.extend(w, r, c, req.Timeout)
}

// refresh (POST /sandboxes/{id}/refreshes, {duration}) keeps the sandbox
// alive duration seconds more from now.
func (h *handler) refresh(w http.ResponseWriter, r *http.Request, c call) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := readBody(r, &req); err != nil {
		return err
	}
	return h.extend(w, r, c, req.Duration)
}

// extend gives the sandbox of r a deadline secs seconds from now (204):
// set_timeout and refreshes.
func (h *handler) extend(w http.ResponseWriter, r *http.Request, c call, secs *int64) error {
	d, err := timeoutOf(secs)
	if err != nil {
		return err
	}
	if _, err := h.find(r, c); err != nil {
		return err
	}
	if _, err := h.o.Engine.SetTimeout(r.Context(), c.tenant, r.PathValue("id"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) pause(w http.ResponseWriter, r *http.Request, c call) error {
	sb, err := h.find(r, c)
	if err != nil {
		return err
	}
	if state(sb) == "paused" {
		return errdefs.Conflictf("sandbox %s is paused already", sb.ID)
	}
	if _, err := h.o.Engine.Pause(r.Context(), c.tenant, sb.ID); err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			return errdefs.Conflictf("%v", err)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect resumes a paused sandbox (201) or returns a running one (200),
// and gives it the body's timeout from now.
func (h *handler) connect(w http.ResponseWriter, r *http.Request, c call) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := readBody(r, &req); err != nil {
		return err
	}
	d, err := timeoutOf(req.Timeout)
	if err != nil {
		return err
	}
	sb, err := h.find(r, c)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if state(sb) == "paused" {
		code = http.StatusCreated
	}
	if sb, err = h.o.Engine.Resume(r.Context(), c.tenant, sb.ID); err != nil {
		return err
	}
	if sb, err = h.o.Engine.SetTimeout(r.Context(), c.tenant, sb.ID, d); err != nil {
		return err
	}
	writeJSON(w, code, h.out(c, sb, sb.Template))
	return nil
}

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int64     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func (h *handler) metrics(w http.ResponseWriter, r *http.Request, c call) error {
	sb, err := h.find(r, c)
	if err != nil {
		return err
	}
	if state(sb) != "running" {
		writeJSON(w, http.StatusOK, []metric{})
		return nil
	}
	st, err := h.o.Engine.Stats(r.Context(), c.tenant, sb.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, []metric{{Timestamp: st.Time, TimestampUnix: st.Time.Unix(), CPUCount: max(sb.Limits.MilliCPUs/1000, 1),
		MemUsed: st.MemoryBytes, MemTotal: sb.Limits.MemoryBytes, DiskUsed: st.DiskUsedBytes, DiskTotal: st.DiskTotalBytes}})
	return nil
}
