import { useState } from 'preact/hooks'
import { get, post, call, esc } from './api.js'
import { useLoad, Err, Badge, when, Tabs, Link } from './ui.jsx'

const TABS = ['Tenants', 'Keys', 'Quotas', 'Audit']

// Admin: tenants, their API keys and quotas, and the audit trail with its
// verification status. Shown only to a key with scope admin (the routes
// refuse the others anyway).
export function Admin({ tab, sel }) {
  const cur = TABS.find((t) => t.toLowerCase() === tab) || 'Tenants'
  const [tenants, err, reload] = useLoad(() => get('/v1/tenants'), [], 10000)
  const ts = (tenants && tenants.tenants) || []
  const tenant = sel || (ts[0] && ts[0].id) || ''
  const setSel = (t) => { location.hash = '/admin/' + cur.toLowerCase() + '/' + esc(t) }
  return (
    <section>
      <h2>Admin</h2>
      <Err err={err} />
      <Tabs tabs={TABS} cur={cur} onPick={(t) => { location.hash = '/admin/' + t.toLowerCase() + (sel ? '/' + esc(sel) : '') }} />
      {cur !== 'Tenants' && (
        <div class="facts">tenant <select data-testid="admin-tenant" value={tenant} onChange={(e) => setSel(e.target.value)}>{ts.map((t) => <option value={t.id}>{t.id}</option>)}</select></div>
      )}
      {cur === 'Tenants' && <Tenants ts={ts} reload={reload} />}
      {cur === 'Keys' && tenant && <Keys tenant={tenant} />}
      {cur === 'Quotas' && tenant && <Quota tenant={tenant} />}
      {cur === 'Audit' && tenant && <Audit tenant={tenant} />}
    </section>
  )
}

function Tenants({ ts, reload }) {
  const [id, setId] = useState('')
  const [err, setErr] = useState(null)
  const create = async (e) => {
    e.preventDefault()
    try { await post('/v1/tenants', { id }); setId(''); setErr(null); reload() } catch (x) { setErr(x) }
  }
  return (
    <div>
      <table data-testid="tenants">
        <thead><tr><th>Tenant</th><th>Name</th><th>State</th><th>Created</th></tr></thead>
        <tbody>{ts.map((t) => <tr data-testid="tenant-row" data-id={t.id}><td>{t.id}</td><td>{t.name}</td><td><Badge v={t.state} /></td><td>{when(t.created)}</td></tr>)}</tbody>
      </table>
      <form class="inline" onSubmit={create}>
        <input data-testid="new-tenant" placeholder="new tenant id" value={id} onInput={(e) => setId(e.target.value)} />
        <button type="submit" disabled={!id}>Create tenant</button>
      </form>
      <Err err={err} />
    </div>
  )
}

function Keys({ tenant }) {
  const [keys, err, reload] = useLoad(() => get('/v1/tenants/' + esc(tenant) + '/keys'), [tenant])
  const [name, setName] = useState('')
  const [scopes, setScopes] = useState({ read: true, write: true, admin: false })
  const [made, setMade] = useState(null)
  const [aerr, setAerr] = useState(null)
  const create = async (e) => {
    e.preventDefault()
    try {
      const k = await post('/v1/tenants/' + esc(tenant) + '/keys', { name, scopes: Object.keys(scopes).filter((s) => scopes[s]) })
      setMade(k); setName(''); setAerr(null); reload()
    } catch (x) { setAerr(x) }
  }
  const revoke = async (n) => {
    if (!confirm(`Revoke key ${n} of ${tenant}?`)) return
    try { await call('DELETE', '/v1/tenants/' + esc(tenant) + '/keys/' + esc(n)); reload() } catch (x) { setAerr(x) }
  }
  return (
    <div>
      <Err err={err} />
      <table data-testid="keys">
        <thead><tr><th>Name</th><th>Prefix</th><th>Scopes</th><th>Created</th><th>Expires</th><th>Revoked</th><th></th></tr></thead>
        <tbody>
          {((keys && keys.keys) || []).map((k) => {
            // An expired key no longer works: marked, like a revoked one.
            const expired = !!k.expires_at && new Date(k.expires_at).getTime() <= Date.now()
            return (
            <tr data-testid="key-row" data-name={k.name} data-expired={expired ? 'true' : 'false'} class={expired || k.revoked_at ? 'dead' : ''}>
              <td>{k.name}</td><td><code>{k.prefix}</code></td><td>{(k.scopes || []).join(', ')}</td><td>{when(k.created)}</td>
              <td>{k.expires_at ? when(k.expires_at) : '–'}{expired && <> <Badge v="expired" /></>}</td><td>{k.revoked_at ? when(k.revoked_at) : '–'}</td>
              <td>{!k.revoked_at && <button class="danger" onClick={() => revoke(k.name)}>Revoke</button>}</td>
            </tr>
            )
          })}
        </tbody>
      </table>
      <form class="inline" onSubmit={create}>
        <input placeholder="key name" value={name} onInput={(e) => setName(e.target.value)} />
        {['read', 'write', 'admin'].map((s) => <label><input type="checkbox" checked={scopes[s]} onChange={(e) => setScopes({ ...scopes, [s]: e.target.checked })} /> {s}</label>)}
        <button type="submit" disabled={!name}>Create key</button>
      </form>
      {made && <div class="ok">Key {made.name}: <code data-testid="new-key">{made.key}</code> — shown once; copy it now.</div>}
      <Err err={aerr} />
    </div>
  )
}

const QUOTA = [
  ['max_sandboxes', 'Sandboxes'], ['max_memory_bytes', 'Memory bytes'], ['max_millicpus', 'Milli-CPUs'],
  ['max_checkpoint_bytes', 'Checkpoint bytes'], ['requests_per_second', 'API requests / s'],
]

function Quota({ tenant }) {
  const [q, err, reload] = useLoad(() => get('/v1/tenants/' + esc(tenant) + '/quota'), [tenant])
  const [edit, setEdit] = useState(null)
  const [aerr, setAerr] = useState(null)
  const save = async (e) => {
    e.preventDefault()
    const body = {}
    for (const [k] of QUOTA) if (edit[k] !== '' && edit[k] != null && Number(edit[k]) !== 0) body[k] = Number(edit[k])
    try { await call('PUT', '/v1/tenants/' + esc(tenant) + '/quota', body); setEdit(null); setAerr(null); reload() } catch (x) { setAerr(x) }
  }
  return (
    <div>
      <Err err={err} />
      {q && !edit && (
        <table data-testid="quota">
          <tbody>{QUOTA.map(([k, l]) => <tr><th>{l}</th><td>{q[k] ? q[k] : 'no limit'}</td></tr>)}</tbody>
        </table>
      )}
      {q && !edit && <button onClick={() => setEdit({ ...q })}>Edit</button>}
      {edit && (
        <form class="panel" onSubmit={save}>
          {QUOTA.map(([k, l]) => <label>{l} <input type="number" value={edit[k] || ''} onInput={(e) => setEdit({ ...edit, [k]: e.target.value })} /></label>)}
          <button type="submit">Save</button> <button type="button" onClick={() => setEdit(null)}>Cancel</button>
        </form>
      )}
      <Err err={aerr} />
    </div>
  )
}

function Audit({ tenant }) {
  const [from, setFrom] = useState(0)
  const [v, verr, reverify] = useLoad(() => get('/v1/audit/verify?tenant=' + esc(tenant)), [tenant])
  const [list, err] = useLoad(async () => {
    // The newest page: the head is known from the verification report.
    const r = await get('/v1/audit/verify?tenant=' + esc(tenant))
    const start = from || Math.max(1, r.head - 199)
    return get(`/v1/audit?tenant=${esc(tenant)}&from=${start}&limit=200`)
  }, [tenant, from])
  const recs = ((list && list.records) || []).slice().reverse()
  return (
    <div>
      <Err err={verr || err} />
      {v && (
        <div class={v.ok ? 'ok' : 'error'} data-testid="audit-verify">
          {v.ok ? `Chain verified: ${v.records} records (#${v.first}–#${v.head}), head ${String(v.head_hash || '').slice(0, 16)}…` : `Chain BROKEN at #${v.bad_seq}: ${v.problem}`}
          {' '}<button onClick={reverify}>Verify again</button>
        </div>
      )}
      <table data-testid="audit">
        <thead><tr><th>#</th><th>When</th><th>Actor</th><th>Action</th><th>Resource</th><th>Outcome</th><th>Detail</th></tr></thead>
        <tbody>
          {recs.map((r) => (
            <tr data-testid="audit-row"><td>{r.seq}</td><td>{when(r.time)}</td><td>{r.actor}</td><td>{r.action}</td><td class="small">{r.resource}</td><td><Badge v={r.outcome} /> {r.status || ''}</td><td class="small">{r.detail}</td></tr>
          ))}
        </tbody>
      </table>
    </div>
  )
}
