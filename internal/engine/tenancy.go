package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/meta"
)

// # Tenancy: tenants, their API keys, and the deployment's nodes
//
// Tenancy is the administration the API's tenant, key and node routes
// call (internal/edge/server tenants.go, nodes.go): it makes and lists
// tenants, makes, lists and revokes API keys, and marks nodes draining or
// live. It is where a key's secret is made and hashed, so that the HTTP
// layer never holds a key's stored form: a new key's secret leaves here
// once, in CreateKey's answer, and only its SHA-256 reaches the store.
//
// Who may call what (the operator, a tenant's admin key) is the edge's to
// decide; Tenancy checks what holds whoever calls: ids and names are
// valid, an expiry is in the future, the operator's own key is not revoked
// through the API (`amber up` owns it), a drained node's sandboxes have
// somewhere to go. It needs only the store's tenants, keys and nodes, and
// the sandbox rows a drain follows; no driver, log or blob.

// TenancyStore is what Tenancy needs of the metadata store.
type TenancyStore interface {
	metadata.Tenants
	metadata.Keys
	metadata.Nodes
	metadata.Sandboxes
}

// Tenancy administers tenants, API keys and nodes (see above).
type Tenancy struct {
	m     TenancyStore
	clock clock.Clock
}

// NewTenancy returns the administration of m's tenants, keys and nodes;
// c decides when keys expire and nodes' leases run (nil: the real clock).
func NewTenancy(m TenancyStore, c clock.Clock) *Tenancy {
	if c == nil {
		c = clock.Real{}
	}
	return &Tenancy{m: m, clock: c}
}

// Key is an API key as those who manage it see it: never its hash.
type Key struct {
	Tenant, Name string
	// Prefix is the secret's first characters, to tell keys apart.
	Prefix string
	Scopes []metadata.Scope
	// Expires and Revoked are zero when the key does not expire or was not
	// revoked.
	Created, Expires, Revoked time.Time
}

func keyOf(k metadata.APIKey) Key {
	return Key{Tenant: k.Tenant, Name: k.Name, Prefix: k.Prefix, Scopes: k.Scopes, Created: k.Created, Expires: k.Expires, Revoked: k.Revoked}
}

// CreateTenant makes tenant id (named name, default the id).
func (t *Tenancy) CreateTenant(ctx context.Context, id, name string) (metadata.Tenant, error) {
	if err := metadata.ValidTenantID(id); err != nil {
		return metadata.Tenant{}, err
	}
	return t.m.CreateTenant(ctx, metadata.Tenant{ID: id, Name: name})
}

// Tenant returns tenant id (ErrNotFound if there is none).
func (t *Tenancy) Tenant(ctx context.Context, id string) (metadata.Tenant, error) {
	return t.m.GetTenant(ctx, id)
}

// Tenants returns every tenant, oldest first.
func (t *Tenancy) Tenants(ctx context.Context) ([]metadata.Tenant, error) {
	return t.m.ListTenants(ctx)
}

// Quota returns tenant's quota (no limits if none was set), as the edge's
// rate limits read it.
func (t *Tenancy) Quota(ctx context.Context, tenant string) (metadata.TenantQuota, error) {
	return t.m.TenantQuota(ctx, tenant)
}

// CreateKey makes a key of tenant called name with scopes (names: "read",
// "write", "admin"), expiring at expires (nil: never). It returns the key
// and its secret, which is shown this once and stored nowhere: the store
// keeps its hash and prefix.
func (t *Tenancy) CreateKey(ctx context.Context, tenant, name string, scopes []string, expires *time.Time) (Key, string, error) {
	ss, err := metadata.ParseScopes(scopes)
	if err != nil {
		return Key{}, "", err
	}
	var exp time.Time
	if expires != nil {
		if now := t.clock.Now(); !expires.After(now) {
			return Key{}, "", errdefs.InvalidArgumentf("expires_at %s is not in the future (now %s)", expires.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		exp = *expires
	}
	secret, err := metadata.NewKeySecret()
	if err != nil {
		return Key{}, "", err
	}
	k, err := t.m.CreateKey(ctx, metadata.APIKey{
		Tenant: tenant, Name: name, Hash: metadata.HashKey(secret), Prefix: metadata.KeyPrefix(secret), Scopes: ss, Expires: exp,
	})
	if err != nil {
		return Key{}, "", err
	}
	return keyOf(k), secret, nil
}

// Keys returns tenant's keys, revoked and expired ones included, oldest
// first.
func (t *Tenancy) Keys(ctx context.Context, tenant string) ([]Key, error) {
	ks, err := t.m.ListKeys(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Key, len(ks))
	for i, k := range ks {
		out[i] = keyOf(k)
	}
	return out, nil
}

// RevokeKey revokes tenant's key name: it is refused from its next call
// on. The operator's key is not revoked here: `amber up` would bring it
// back at its next start, and until then the operator could be locked out.
func (t *Tenancy) RevokeKey(ctx context.Context, tenant, name string) (Key, error) {
	if tenant == metadata.DefaultTenant && name == metadata.OperatorKeyName {
		return Key{}, errdefs.FailedPreconditionf("the operator key %s/%s lives in DATA_DIR/admin.key: delete that file and restart `amber up` to rotate it", tenant, name)
	}
	k, err := t.m.RevokeKey(ctx, tenant, name)
	if err != nil {
		return Key{}, err
	}
	return keyOf(k), nil
}

// Nodes returns every node of the deployment, by id.
func (t *Tenancy) Nodes(ctx context.Context) ([]metadata.Node, error) {
	return t.m.ListNodes(ctx)
}

// Node returns node id (ErrNotFound naming how to list them).
func (t *Tenancy) Node(ctx context.Context, id string) (metadata.Node, error) {
	n, err := t.m.GetNode(ctx, id)
	if errdefs.IsNotFound(err) {
		return n, errdefs.NotFoundf("node %s is not registered (amber node ls lists the nodes)", id)
	}
	return n, err
}

// NodeSandboxes lists the tenants' sandboxes on node id (every state but
// destroyed; not the warm pool's).
func (t *Tenancy) NodeSandboxes(ctx context.Context, id string) ([]metadata.Sandbox, error) {
	no := false
	return t.m.List(ctx, metadata.Filter{Node: &id, Pooled: &no})
}

// Sandbox returns sandbox id's row, whichever its tenant: a drain follows
// the sandboxes that left its node.
func (t *Tenancy) Sandbox(ctx context.Context, id string) (metadata.Sandbox, error) {
	return t.m.Get(ctx, id)
}

// Room is nil when a node other than id can take a new sandbox, else why
// not (meta.Place's ErrResourceExhausted or ErrUnavailable).
func (t *Tenancy) Room(ctx context.Context, id string) error {
	nodes, err := t.m.ListNodes(ctx)
	if err != nil {
		return err
	}
	_, err = meta.Place(nodes, id, "", t.clock.Now())
	return err
}

// Drain marks node n draining: it keeps its lease, takes no new sandboxes,
// and its sandboxes move to other nodes (internal/cluster does the moves).
// It is refused, and the node left as it is, when the node is down or
// holds sandboxes and no other node has room. It returns how many
// sandboxes the node holds.
func (t *Tenancy) Drain(ctx context.Context, n metadata.Node) (int, error) {
	if !n.Alive(t.clock.Now()) {
		return 0, errdefs.FailedPreconditionf("node %s is %s and its lease does not run: there is nothing to drain (the live nodes take a dead node's sandboxes over)", n.ID, n.State)
	}
	rows, err := t.NodeSandboxes(ctx, n.ID)
	if err != nil {
		return 0, err
	}
	if len(rows) > 0 {
		if err := t.Room(ctx, n.ID); err != nil {
			return 0, fmt.Errorf("drain node %s, which holds %d sandboxes: %w", n.ID, len(rows), err)
		}
	}
	if n.State == metadata.NodeLive {
		if err := t.m.SetNodeState(ctx, n.ID, n.Epoch, metadata.NodeDraining); err != nil {
			return 0, fmt.Errorf("drain node %s: %w", n.ID, err)
		}
	}
	return len(rows), nil
}

// Undrain makes draining node n live again: it takes new sandboxes (the
// ones it moved stay where they went).
func (t *Tenancy) Undrain(ctx context.Context, n metadata.Node) error {
	if n.State != metadata.NodeDraining || !n.Alive(t.clock.Now()) {
		return errdefs.FailedPreconditionf("node %s is %s, not draining", n.ID, n.State)
	}
	if err := t.m.SetNodeState(ctx, n.ID, n.Epoch, metadata.NodeLive); err != nil {
		return fmt.Errorf("undrain node %s: %w", n.ID, err)
	}
	return nil
}
