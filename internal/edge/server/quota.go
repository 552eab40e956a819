package server

import (
	"net/http"
	"sync"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

func (s *Server) getTenantQuota(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	q, err := s.eng.TenantQuota(r.Context(), tenant)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.TenantQuota(q))
}

func (s *Server) putTenantQuota(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if !c.operator() {
		if err := s.manages(r, c, tenant); err != nil {
			return err
		}
		return errdefs.PermissionDeniedf("quotas are the operator's to set (an admin-scoped key of tenant %s)", metadata.DefaultTenant)
	}
	var req api.TenantQuota
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if err := s.eng.SetTenantQuota(r.Context(), tenant, metadata.TenantQuota(req)); err != nil {
		return err
	}
	s.rates.forget(tenant)
	c.lg.InfoContext(r.Context(), "tenant quota set", "for_tenant", tenant, "quota", req)
	return writeJSON(w, http.StatusOK, req)
}

// rateLimits holds a token bucket per tenant for the requests-per-second
// quota; a tenant's quota is re-read at most once a second.
type rateLimits struct {
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	rate, tokens float64
	last, read   time.Time
}

func (rl *rateLimits) forget(tenant string) {
	rl.mu.Lock()
	delete(rl.buckets, tenant)
	rl.mu.Unlock()
}

// allow takes a token of tenant's bucket; it reports false (and the rate)
// when the tenant is over its requests-per-second quota.
func (s *Server) allow(r *http.Request, tenant string) (bool, float64) {
	now := time.Now()
	s.rates.mu.Lock()
	if s.rates.buckets == nil {
		s.rates.buckets = map[string]*bucket{}
	}
	b := s.rates.buckets[tenant]
	s.rates.mu.Unlock()
	if b == nil || now.Sub(b.read) > time.Second {
		q, err := s.tenancy.Quota(r.Context(), tenant)
		if err != nil {
			return true, 0 // the store will tell the handler
		}
		s.rates.mu.Lock()
		if b == nil {
			b = &bucket{tokens: 2 * q.RequestsPerSecond, last: now}
			s.rates.buckets[tenant] = b
		}
		b.rate, b.read = q.RequestsPerSecond, now
		s.rates.mu.Unlock()
	}
	s.rates.mu.Lock()
	defer s.rates.mu.Unlock()
	if b.rate <= 0 {
		return true, 0
	}
	b.tokens = min(2*b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false, b.rate
	}
	b.tokens--
	return true, b.rate
}
