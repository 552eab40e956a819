package engine

import (
	"context"
	"sync"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
)

// quotas checks tenants' quotas (quota.go); it needs only the core.
type quotas struct {
	*core
	tenantLocks sync.Map // tenant → *sync.Mutex
}

// Quotas (meta.TenantQuota): a new sandbox (create, fork) must fit the
// tenant's sandbox count, memory and CPU quotas counting every sandbox it
// has that is not destroyed; a checkpoint must find the tenant's stored
// checkpoint bytes under its quota. Exceeding one is
// errdefs.ErrResourceExhausted (HTTP 429) naming the quota. The check and
// the new sandbox's row are made under the tenant's quota lock, so
// concurrent creates cannot both pass the last free slot. Usage budgets,
// quotas enforced from the meters, are in budget.go.

// QuotaObserver is an Observer that also counts quota refusals (found by
// type assertion; internal/obs/metrics is one).
type QuotaObserver interface {
	QuotaRejected(tenant, quota string)
}

func (e *quotas) quotaLock(tenant string) func() {
	m, _ := e.tenantLocks.LoadOrStore(tenant, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// TenantQuota returns tenant's quota.
func (e *quotas) TenantQuota(ctx context.Context, tenant string) (meta.TenantQuota, error) {
	return e.meta.TenantQuota(ctx, tenant)
}

// reserveSandbox checks that one more sandbox with limits l fits tenant's
// quota. When the tenant has a sandbox quota it returns holding the
// tenant's quota lock, which the caller releases (release) once the new
// sandbox's row exists; without one, it locks nothing (creates of a tenant
// without quota run in parallel).
func (e *quotas) reserveSandbox(ctx context.Context, tenant string, l sandbox.Limits) (release func(), err error) {
	if err := e.admit(ctx, tenant); err != nil {
		return nil, err
	}
	q, err := e.meta.TenantQuota(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if q.MaxSandboxes == 0 && q.MaxMemoryBytes == 0 && q.MaxMilliCPUs == 0 {
		return func() {}, nil
	}
	unlock := e.quotaLock(tenant)
	if err := e.checkSandboxQuota(ctx, tenant, q, l); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

func (e *quotas) checkSandboxQuota(ctx context.Context, tenant string, q meta.TenantQuota, l sandbox.Limits) error {
	rows, err := e.meta.List(ctx, meta.Filter{Tenant: &tenant})
	if err != nil {
		return err
	}
	var mem, cpu int64
	for _, sb := range rows {
		mem += sb.Limits.MemoryBytes
		cpu += sb.Limits.MilliCPUs
	}
	switch {
	case q.MaxSandboxes > 0 && len(rows)+1 > q.MaxSandboxes:
		return e.refuse(tenant, "max_sandboxes", "quota max_sandboxes of tenant %s reached: it has %d of %d (destroy one first)", tenant, len(rows), q.MaxSandboxes)
	case q.MaxMemoryBytes > 0 && mem+l.MemoryBytes > q.MaxMemoryBytes:
		return e.refuse(tenant, "max_memory_bytes", "quota max_memory_bytes of tenant %s: its sandboxes hold %d bytes, %d more would pass %d", tenant, mem, l.MemoryBytes, q.MaxMemoryBytes)
	case q.MaxMilliCPUs > 0 && cpu+l.MilliCPUs > q.MaxMilliCPUs:
		return e.refuse(tenant, "max_millicpus", "quota max_millicpus of tenant %s: its sandboxes hold %d millicpus, %d more would pass %d", tenant, cpu, l.MilliCPUs, q.MaxMilliCPUs)
	}
	return nil
}

// checkCheckpointQuota fails when tenant's checkpoints already fill its
// checkpoint storage quota.
func (e *quotas) checkCheckpointQuota(ctx context.Context, tenant string) error {
	q, err := e.meta.TenantQuota(ctx, tenant)
	if err != nil || q.MaxCheckpointBytes == 0 {
		return err
	}
	used, err := e.meta.CheckpointBytes(ctx, tenant)
	if err != nil {
		return err
	}
	if used >= q.MaxCheckpointBytes {
		return e.refuse(tenant, "max_checkpoint_bytes", "quota max_checkpoint_bytes of tenant %s reached: its checkpoints store %d of %d bytes (delete some, or keep fewer)", tenant, used, q.MaxCheckpointBytes)
	}
	return nil
}
