import { useEffect, useState, useRef } from 'preact/hooks'
import { get, post, call, operation, text, esc } from './api.js'
import { useLoad, Err, Badge, Link, when, bytes, short, Tabs, Graph, Json, useNeed, Confirm } from './ui.jsx'
import { Terminal as XTerm } from '@xterm/xterm'
import '@xterm/xterm/css/xterm.css'

export function Sandboxes() {
  const [list, err] = useLoad(() => get('/v1/sandboxes'), [], 3000)
  const sbs = (list && list.sandboxes) || []
  return (
    <section>
      <h2>Sandboxes</h2>
      <NewSandbox />
      <Err err={err} />
      <table data-testid="sandboxes">
        <thead><tr><th>Sandbox</th><th>State</th><th>Template</th><th>Driver</th><th>Generation</th><th>Origin</th><th>Updated</th><th>Expires</th><th>Metadata</th></tr></thead>
        <tbody>
          {sbs.map((s) => (
            <tr data-testid="sandbox-row" data-id={s.id}>
              <td><Link to={'/sandboxes/' + esc(s.id)}>{s.id}</Link></td>
              <td><Badge v={s.state} /></td>
              <td>{s.template} <span class="muted">{short(s.template_version)}</span></td>
              <td>{s.driver}</td>
              <td>{s.generation}</td>
              <td>{s.origin ? short(s.origin) : '–'}</td>
              <td>{when(s.updated)}</td>
              <td data-testid="expires">{s.expires_at ? when(s.expires_at) + (s.on_timeout === 'pause' ? ' (pause)' : '') : '–'}</td>
              <td data-testid="metadata" class="small">{Object.entries(s.metadata || {}).map(([k, v]) => k + '=' + v).join(', ') || '–'}</td>
            </tr>
          ))}
          {list && sbs.length === 0 && <tr><td colSpan="9" class="muted">No sandboxes for this tenant.</td></tr>}
        </tbody>
      </table>
    </section>
  )
}

// NewSandbox creates a sandbox from a template (POST /v1/sandboxes) and
// opens it.
function NewSandbox() {
  const need = useNeed('write')
  const [tpls] = useLoad(() => get('/v1/templates'), [])
  const [tpl, setTpl] = useState('')
  const [busy, setBusy] = useState(false)
  const [err, setErr] = useState(null)
  const names = ((tpls && tpls.templates) || []).map((t) => t.name)
  const pick = tpl || names[0] || ''
  const create = async (e) => {
    e.preventDefault()
    setBusy(true); setErr(null)
    try {
      const sb = await post('/v1/sandboxes', { template: pick })
      location.hash = '/sandboxes/' + esc(sb.id)
    } catch (x) { setErr(x) }
    setBusy(false)
  }
  return (
    <form class="inline" onSubmit={create} data-testid="new-sandbox">
      <select data-testid="new-sandbox-template" value={pick} onChange={(e) => setTpl(e.target.value)}>
        {names.map((n) => <option value={n}>{n}</option>)}
      </select>
      {' '}<button type="submit" data-testid="create-sandbox" disabled={!!need || busy || !pick} title={need || 'Create a sandbox from this template'}>Create sandbox</button>
      {busy && <span class="muted"> creating…</span>}
      <Err err={err} />
    </form>
  )
}

const TABS = ['Overview', 'Checkpoints', 'Effects', 'Terminal', 'Files']

export function SandboxPage({ id, tab }) {
  const cur = TABS.find((t) => t.toLowerCase() === tab) || 'Overview'
  const [sb, err, reload] = useLoad(() => get('/v1/sandboxes/' + esc(id)), [id], 3000)
  const pick = (t) => { location.hash = '/sandboxes/' + esc(id) + '/' + t.toLowerCase() }
  // A sandbox that cannot be loaded (not found, not this tenant's): its
  // error once, not again from every tab's own calls.
  if (err && !sb) return <section><h2>Sandbox <code>{id}</code></h2><Err err={err} /></section>
  return (
    <section>
      <h2>Sandbox <code>{id}</code> {sb && <Badge v={sb.state} />}</h2>
      <Err err={err} />
      {sb && (
        <div class="facts">
          <span>template {sb.template} <span class="muted">{sb.template_version}</span></span>
          <span>driver {sb.driver}</span>
          <span>generation <b data-testid="generation">{sb.generation}</b></span>
          <span>origin <span data-testid="origin">{sb.origin || '–'}</span></span>
          {sb.recovery && <span>recovery {sb.recovery}</span>}
        </div>
      )}
      <Tabs tabs={TABS} cur={cur} onPick={pick} />
      {cur === 'Overview' && <Overview id={id} sb={sb} reload={reload} />}
      {cur === 'Checkpoints' && <Checkpoints id={id} sb={sb} reload={reload} />}
      {cur === 'Effects' && <Effects id={id} />}
      {cur === 'Terminal' && <Term id={id} running={sb && sb.state === 'running'} />}
      {cur === 'Files' && <Files id={id} />}
    </section>
  )
}

// Overview: live resource graphs (GET …/stats every 2 s) and actions.
function Overview({ id, sb, reload }) {
  const [pts, setPts] = useState({ cpu: [], mem: [], disk: [] })
  const [serr, setSerr] = useState(null)
  const [busy, setBusy] = useState('')
  const [aerr, setAerr] = useState(null)
  const prev = useRef(null)
  useEffect(() => {
    let alive = true
    const tick = async () => {
      try {
        const s = await get('/v1/sandboxes/' + esc(id) + '/stats')
        if (!alive) return
        setSerr(null)
        const p = prev.current
        prev.current = s
        const t = new Date(s.time).getTime()
        setPts((o) => {
          const keep = (a, v) => [...a, { t, v }].slice(-60)
          let cpu = o.cpu
          if (p) {
            const dt = (t - new Date(p.time).getTime()) * 1e6
            const dc = s.cpu_ns - p.cpu_ns
            if (dt > 0 && dc >= 0) cpu = keep(o.cpu, (100 * dc) / dt) // a drop: a new incarnation, skip
          }
          return { cpu, mem: keep(o.mem, s.memory_bytes), disk: s.disk_used_bytes >= 0 ? keep(o.disk, s.disk_used_bytes) : o.disk }
        })
      } catch (e) { if (alive) setSerr(e) }
    }
    tick()
    const t = setInterval(tick, 2000)
    return () => { alive = false; clearInterval(t) }
  }, [id])
  const need = useNeed('write')
  const act = async (what, fn) => {
    setBusy(what); setAerr(null)
    try { await fn() } catch (e) { setAerr(e) }
    setBusy(''); reload()
  }
  const destroy = async () => {
    setBusy('destroy'); setAerr(null)
    try {
      await call('DELETE', '/v1/sandboxes/' + esc(id))
      location.hash = '/sandboxes'
    } catch (e) { setAerr(e); setBusy('') }
  }
  return (
    <div>
      <div class="graphs">
        <Graph title="CPU %" points={pts.cpu} fmt={(v) => v.toFixed(1) + ' %'} max={100} testid="graph-cpu" />
        <Graph title="Memory" points={pts.mem} fmt={bytes} testid="graph-mem" />
        <Graph title="Disk used" points={pts.disk} fmt={bytes} testid="graph-disk" />
      </div>
      {serr && <div class="muted">stats: {serr.message}</div>}
      <div class="actions">
        <button data-testid="checkpoint-now" disabled={!!busy || !!need} title={need} onClick={() => act('checkpoint', () => operation('/v1/sandboxes/' + esc(id) + '/checkpoints', { tag: 'console' }))}>Checkpoint now</button>
        <button data-testid="recover-latest" disabled={!!busy || !!need} title={need} onClick={() => act('recover', () => operation('/v1/sandboxes/' + esc(id) + '/recover', {}))}>Recover from latest checkpoint</button>
        <button class="danger" data-testid="kill" disabled={!!busy || !!need || !sb || sb.state !== 'running'} title={need || (sb && sb.state !== 'running' ? 'The sandbox is not running' : '')} onClick={() => act('kill', () => post('/v1/sandboxes/' + esc(id) + '/kill'))}>Kill</button>
        <Confirm testid="destroy" label="Destroy" confirm="Destroy: its state is gone" disabled={!!busy || !!need} title={need || 'Destroy the sandbox (its checkpoints stay)'} onYes={destroy} />
        {busy && <span class="muted">{busy}…</span>}
      </div>
      <Err err={aerr} />
    </div>
  )
}

function fidelity(p) {
  return `${p.processes} processes, ${bytes(p.memory_bytes)} memory, ${p.files} files, connections ${p.connections_restored} restored / ${p.connections_reset} reset` +
    `${p.lazy ? ', lazy' : ''}; fetch ${(p.fetch_ns / 1e6).toFixed(0)} ms, driver ${(p.running_ns / 1e6).toFixed(0)} ms; image ${short(p.image_digest)}`
}

// Checkpoints: the tree of the sandbox's checkpoints (parents, the restores
// from each with their fidelity reports, the forks made from them), and
// the lifecycle events with "restore to here".
function Checkpoints({ id, sb, reload }) {
  const [cks, err, reloadCks] = useLoad(() => get('/v1/sandboxes/' + esc(id) + '/checkpoints?all=true'), [id], 4000)
  const [evs, everr, reloadEvs] = useLoad(() => get('/v1/sandboxes/' + esc(id) + '/events?limit=1000'), [id], 4000)
  const [all] = useLoad(() => get('/v1/sandboxes'), [id], 8000)
  const [busy, setBusy] = useState('')
  const [prog, setProg] = useState(null)
  const [aerr, setAerr] = useState(null)
  const [done, setDone] = useState('')
  const need = useNeed('write')
  const run = async (what, path, body, after) => {
    setBusy(what); setAerr(null); setDone('')
    try {
      const fr = await operation(path, body, setProg)
      setDone(what + ' done')
      after && after(fr)
    } catch (e) { setAerr(e) }
    setBusy(''); setProg(null); reload(); reloadCks(); reloadEvs()
  }
  const list = (cks && cks.checkpoints) || []
  const events = (evs && evs.events) || []
  const byId = {}
  for (const c of list) byId[c.id] = { c, kids: [], restores: [], forks: [] }
  const roots = []
  for (const c of list) (c.parent && byId[c.parent] ? byId[c.parent].kids : roots).push(byId[c.id])
  const restores = events.filter((e) => e.type === 'sandbox.restored')
  const forkedFrom = restores.filter((e) => e.payload.from && e.payload.from !== id)
  for (const e of restores) if (byId[e.payload.checkpoint]) byId[e.payload.checkpoint].restores.push(e)
  for (const s of (all && all.sandboxes) || []) if (s.id !== id && s.origin && byId[s.origin]) byId[s.origin].forks.push(s)
  const restoreIds = new Set(list.map((c) => c.id))
  // "Restore to #N" recovers from the newest committed checkpoint of this
  // sandbox cut at or before event N: offered only where there is one.
  const cuts = list.filter((c) => c.state === 'committed' && c.sandbox_id === id).map((c) => c.seq)
  const firstCut = cuts.length ? Math.min(...cuts) : Infinity

  const Node = ({ n }) => (
    <li class="ck" data-testid="checkpoint" data-id={n.c.id}>
      <div class="ck-line">
        <b>{n.c.tag || short(n.c.id)}</b> <Badge v={n.c.state} />
        <span class="muted"> cut at event #{n.c.event_seq || n.c.seq}{n.c.reason ? ' · ' + n.c.reason : ''} · template {n.c.template}@{short(n.c.template_version)} · {when(n.c.created)}</span>
        <span class="ck-actions">
          <button data-testid="restore" disabled={!!busy || !!need || n.c.state !== 'committed'} title={need} onClick={() => run('restore', '/v1/checkpoints/' + esc(n.c.id) + '/restore', {})}>Restore</button>
          <button data-testid="fork" disabled={!!busy || !!need || n.c.state !== 'committed'} title={need} onClick={() => run('fork', '/v1/checkpoints/' + esc(n.c.id) + '/restore', { as_new: true },
            (fr) => fr.sandbox && (location.hash = '/sandboxes/' + esc(fr.sandbox.id) + '/checkpoints'))}>Fork</button>
        </span>
      </div>
      <div class="muted small">{n.c.id} · memory {bytes(n.c.stats && n.c.stats.memory_bytes)} · layer {bytes(n.c.stats && n.c.stats.layer_bytes)}</div>
      {n.restores.map((e) => (
        <div class="restore" data-testid="restore-report" data-seq={e.seq}>↺ restore #{e.seq}, generation {e.payload.generation}: {fidelity(e.payload)}</div>
      ))}
      {n.forks.map((s) => <div class="fork">↳ fork <Link to={'/sandboxes/' + esc(s.id) + '/checkpoints'}>{s.id}</Link> <Badge v={s.state} /></div>)}
      {n.kids.length > 0 && <ul>{n.kids.map((k) => <Node n={k} />)}</ul>}
    </li>
  )
  return (
    <div>
      <Err err={err || everr} />
      {busy && <div class="muted" data-testid="busy">{busy}… {prog ? prog.phase + (prog.total ? ` ${prog.done}/${prog.total}` : '') : ''}</div>}
      {done && <div class="ok" data-testid="op-done">{done}</div>}
      <Err err={aerr} />
      {forkedFrom.map((e) => <div class="fork">↳ this sandbox is a fork of <Link to={'/sandboxes/' + esc(e.payload.from) + '/checkpoints'}>{e.payload.from}</Link> (checkpoint {short(e.payload.checkpoint)})</div>)}
      <h3>Checkpoint tree</h3>
      <ul class="tree" data-testid="ck-tree">{roots.map((n) => <Node n={n} />)}</ul>
      {list.length === 0 && <div class="muted">No checkpoints yet.</div>}
      <h3>Restores and their fidelity reports</h3>
      <table data-testid="restores">
        <thead><tr><th>#</th><th>When</th><th>From checkpoint</th><th>Generation</th><th>Fidelity</th></tr></thead>
        <tbody>
          {restores.map((e) => (
            <tr data-testid="restore-row"><td>{e.seq}</td><td>{when(e.time)}</td><td>{short(e.payload.checkpoint)}{restoreIds.has(e.payload.checkpoint) ? '' : ' (another sandbox\'s)'}</td><td>{e.payload.generation}</td><td>{fidelity(e.payload)}</td></tr>
          ))}
        </tbody>
      </table>
      <h3>Lifecycle events</h3>
      <table data-testid="lifecycle">
        <thead><tr><th>#</th><th>When</th><th>Event</th><th>Detail</th><th></th></tr></thead>
        <tbody>
          {events.map((e) => (
            <tr data-testid="lifecycle-event" data-seq={e.seq} data-type={e.type}>
              <td>{e.seq}</td><td>{when(e.time)}</td><td>{e.type}</td>
              <td class="small">{e.type === 'sandbox.checkpointed' ? `checkpoint ${short(e.payload.checkpoint)}` : e.type === 'sandbox.restored' ? `from ${short(e.payload.checkpoint)}` : (e.payload.state || e.payload.template || '')}{e.payload.reason ? ' — ' + e.payload.reason : ''}</td>
              <td>{e.seq >= firstCut
                ? <button data-testid="restore-to-event" disabled={!!busy || !!need} title={need || 'Restore to the newest checkpoint cut at or before this event'}
                  onClick={() => run('restore to event ' + e.seq, '/v1/sandboxes/' + esc(id) + '/recover', { to_event: e.seq })}>Restore to #{e.seq}</button>
                : <span class="muted small" data-testid="no-restore" title={'No checkpoint is cut at or before #' + e.seq}>no checkpoint by then</span>}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  )
}

// Effects: the sandbox's effect journal and the reconcile action.
function Effects({ id }) {
  const need = useNeed('write')
  const [fx, err, reload] = useLoad(() => get('/v1/sandboxes/' + esc(id) + '/effects'), [id], 3000)
  const [form, setForm] = useState(null)
  const [ferr, setFerr] = useState(null)
  const list = (fx && fx.effects) || []
  const label = (f) => {
    if (f.state === 'needs-reconciliation') return 'needs reconciliation'
    if (f.state === 'in-flight') return 'in flight'
    if (f.reconciled) return 'reconciled'
    return 'forwarded'
  }
  const submit = async (e) => {
    e.preventDefault()
    try {
      await post('/v1/sandboxes/' + esc(id) + '/effects/reconcile', { key: form.key, status: Number(form.status), body: form.body, note: form.note })
      setForm(null); setFerr(null); reload()
    } catch (x) { setFerr(x) }
  }
  return (
    <div>
      <Err err={err} />
      {fx && <div class="facts"><span>{list.length} effects</span><span>needing reconciliation <b data-testid="needs-count">{fx.needs_reconciliation || 0}</b></span></div>}
      <table data-testid="effects">
        <thead><tr><th>#</th><th>Request</th><th>Mode</th><th>Outcome</th><th>Answered from journal</th><th>Attempts</th><th>Run</th><th></th></tr></thead>
        <tbody>
          {list.map((f) => (
            <tr data-testid="effect" data-key={f.key} data-state={f.state}>
              <td>{f.seq}</td>
              <td><code>{f.method} {f.url}</code></td>
              <td>{f.mode}</td>
              <td><Badge v={label(f)} /> {f.status ? f.status : ''} {f.error && <span class="muted">{f.error}</span>} {f.reconciled && <span class="muted">“{f.reconciled}”</span>}</td>
              <td data-testid="replays">{f.replays ? `${f.replays}×` : '–'}</td>
              <td>{f.attempts}{f.divergences ? `, ${f.divergences} divergent` : ''}</td>
              <td class="small">{short(f.run)}</td>
              <td>{f.state === 'needs-reconciliation' && <button data-testid="reconcile" disabled={!!need} title={need} onClick={() => setForm({ key: f.key, status: 200, body: '', note: '' })}>Reconcile…</button>}</td>
            </tr>
          ))}
          {fx && list.length === 0 && <tr><td colSpan="8" class="muted">No outbound requests journaled.</td></tr>}
        </tbody>
      </table>
      {form && (
        <form class="panel" onSubmit={submit} data-testid="reconcile-form">
          <h3>Reconcile <code>{short(form.key)}</code></h3>
          <p class="muted">Say what you found at the destination. The status and body become the request's recorded answer: a re-run is answered with them from the journal and the destination is not contacted again.</p>
          <label>Status <input type="number" data-testid="rec-status" value={form.status} onInput={(e) => setForm({ ...form, status: e.target.value })} /></label>
          <label>Body <textarea data-testid="rec-body" value={form.body} onInput={(e) => setForm({ ...form, body: e.target.value })} /></label>
          <label>Note <input data-testid="rec-note" value={form.note} placeholder="e.g. order 42 exists in the shop's ledger" onInput={(e) => setForm({ ...form, note: e.target.value })} /></label>
          <button type="submit" data-testid="rec-submit">Record outcome</button> <button type="button" onClick={() => setForm(null)}>Cancel</button>
          <Err err={ferr} />
        </form>
      )}
    </div>
  )
}

// Term: a shell on a PTY in the sandbox over a WebSocket, opened with a
// single-use ticket (POST …/terminal) since a browser WebSocket cannot
// carry the Authorization header.
function Term({ id, running }) {
  const need = useNeed('write')
  const el = useRef(null)
  const [state, setState] = useState('idle')
  const [err, setErr] = useState(null)
  const [gen, setGen] = useState(0)
  useEffect(() => {
    if (!running || need || !el.current) return
    const term = new XTerm({ cols: 100, rows: 26, convertEol: false, fontSize: 13, cursorBlink: true })
    term.open(el.current)
    let ws = null
    let alive = true
    ;(async () => {
      try {
        setState('connecting')
        const t = await post('/v1/sandboxes/' + esc(id) + '/terminal')
        if (!alive) return
        const proto = location.protocol === 'https:' ? 'wss:' : 'ws:'
        ws = new WebSocket(`${proto}//${location.host}${t.path}&cols=${term.cols}&rows=${term.rows}`)
        ws.binaryType = 'arraybuffer'
        ws.onopen = () => { setState('open'); term.focus() }
        ws.onmessage = (m) => {
          if (typeof m.data === 'string') {
            const c = JSON.parse(m.data)
            if (c.exit) term.write(`\r\n[exited with code ${c.exit.code}]\r\n`)
            if (c.error) term.write(`\r\n[error: ${c.error.message}]\r\n`)
          } else term.write(new Uint8Array(m.data))
        }
        ws.onclose = () => alive && setState('closed')
        term.onData((d) => ws && ws.readyState === 1 && ws.send(d))
      } catch (e) { setErr(e); setState('error') }
    })()
    return () => { alive = false; ws && ws.close(); term.dispose() }
  }, [id, running, gen])
  if (!running) return <div class="muted">The sandbox is not running.</div>
  if (need) return <div class="muted" data-testid="term-denied">{need}: a terminal runs commands.</div>
  return (
    <div>
      <div class="facts"><span>terminal <b data-testid="term-state">{state}</b></span>{state === 'closed' && <button onClick={() => setGen(gen + 1)}>Reconnect</button>}</div>
      <Err err={err} />
      <div class="term" ref={el} data-testid="terminal" />
    </div>
  )
}

// Files: a browser of the sandbox's filesystem.
function Files({ id }) {
  const [path, setPath] = useState('/')
  const [view, setView] = useState(null)
  const [err, setErr] = useState(null)
  useEffect(() => {
    let alive = true
    ;(async () => {
      try {
        const st = await get('/v1/sandboxes/' + esc(id) + '/files?stat=true&path=' + esc(path))
        let v
        if (st.type === 'dir') v = { dir: await get('/v1/sandboxes/' + esc(id) + '/files?path=' + esc(path)) }
        else if (st.size > 256 * 1024) v = { info: st, content: `(${bytes(st.size)}: too large to show here)` }
        else v = { info: st, content: await text('/v1/sandboxes/' + esc(id) + '/files?path=' + esc(path)) }
        if (alive) { setView(v); setErr(null) }
      } catch (e) { if (alive) setErr(e) }
    })()
    return () => { alive = false }
  }, [id, path])
  const join = (n) => (path === '/' ? '/' + n : path + '/' + n)
  const up = path === '/' ? '/' : path.replace(/\/[^/]+$/, '') || '/'
  return (
    <div>
      <form class="pathbar" onSubmit={(e) => { e.preventDefault(); setPath(e.target.elements.p.value || '/') }}>
        <button type="button" onClick={() => setPath(up)}>↑</button>
        <input name="p" data-testid="file-path" value={path} key={path} />
        <button type="submit">Open</button>
      </form>
      <Err err={err} />
      {view && view.dir && (
        <table data-testid="files">
          <thead><tr><th>Name</th><th>Type</th><th>Size</th><th>Mode</th><th>Modified</th></tr></thead>
          <tbody>
            {(view.dir.entries || []).map((f) => (
              <tr data-testid="file" data-name={f.name}>
                <td><button class="link" data-testid="file-open" onClick={() => setPath(join(f.name))}>{f.name}{f.type === 'dir' ? '/' : ''}</button>{f.link ? <span class="muted"> → {f.link}</span> : ''}</td>
                <td>{f.type}</td><td>{f.type === 'file' ? bytes(f.size) : ''}</td><td>{f.mode}</td><td>{when(f.mtime)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {view && view.info && <pre class="file" data-testid="file-content">{view.content}</pre>}
    </div>
  )
}
