import { useEffect, useState, useRef } from 'preact/hooks'
import { get, post, followSession, esc } from './api.js'
import { useLoad, Err, Badge, Link, when, short, useNeed, Confirm } from './ui.jsx'

// Sessions lists the tenant's agent sessions with their status and what
// their sandboxes used (GET /v1/usage grouped by sandbox).
export function Sessions() {
  const [list, err] = useLoad(() => get('/v1/sessions'), [], 3000)
  const [usage] = useLoad(() => get('/v1/usage?group_by=sandbox').catch(() => null), [], 10000)
  const by = {}
  for (const r of (usage && usage.rows) || []) {
    if (!r.sandbox) continue
    by[r.sandbox] = by[r.sandbox] || {}
    by[r.sandbox][r.meter] = r.quantity
  }
  const ss = (list && list.sessions) || []
  return (
    <section>
      <h2>Sessions</h2>
      <NewSession />
      <Err err={err} />
      <table data-testid="sessions">
        <thead><tr><th>Session</th><th>Status</th><th>Sandbox</th><th>Model tokens</th><th>CPU s</th><th>Egress requests</th><th>Checkpoints</th><th>Updated</th></tr></thead>
        <tbody>
          {ss.map((s) => {
            const u = by[s.sandbox] || {}
            return (
              <tr data-testid="session-row" data-id={s.id}>
                <td><Link to={'/sessions/' + esc(s.id)}>{s.id}</Link></td>
                <td><Badge v={s.status} /></td>
                <td>{s.sandbox ? <Link to={'/sandboxes/' + esc(s.sandbox)}>{short(s.sandbox)}</Link> : '–'}</td>
                <td><Tokens id={s.id} updated={s.updated} /></td>
                <td>{u.cpu_seconds != null ? u.cpu_seconds.toFixed(2) : '–'}</td>
                <td>{u.egress_requests != null ? u.egress_requests : '–'}</td>
                <td>{u.checkpoints != null ? u.checkpoints : '–'}</td>
                <td>{when(s.updated)}</td>
              </tr>
            )
          })}
          {list && ss.length === 0 && <tr><td colSpan="8" class="muted">No sessions for this tenant.</td></tr>}
        </tbody>
      </table>
    </section>
  )
}

// A session definition to start from: the scripted model needs no
// provider. POST /v1/sessions takes any SessionDefinition.
const EXAMPLE = JSON.stringify({ model: { adapter: 'scripted', script: [{ text: 'Hello from a scripted agent.' }] }, template: 'python', policy: 'strict' }, null, 1)

// NewSession creates a session from a definition (JSON) and opens it.
function NewSession() {
  const need = useNeed('write')
  const [open, setOpen] = useState(false)
  const [def, setDef] = useState(EXAMPLE)
  const [err, setErr] = useState(null)
  const create = async (e) => {
    e.preventDefault()
    setErr(null)
    let body
    try { body = JSON.parse(def) } catch (x) { setErr({ kind: 'invalid argument', message: 'the definition is not JSON: ' + x.message }); return }
    try {
      const se = await post('/v1/sessions', body)
      location.hash = '/sessions/' + esc(se.id)
    } catch (x) { setErr(x) }
  }
  if (!open) return <button data-testid="new-session" disabled={!!need} title={need || 'Start an agent session'} onClick={() => setOpen(true)}>New session…</button>
  return (
    <form class="panel" onSubmit={create} data-testid="new-session-form">
      <label>Definition (model, system, tools, limits, template, policy) <textarea data-testid="new-session-def" rows="6" value={def} onInput={(e) => setDef(e.target.value)} /></label>
      <button type="submit" data-testid="create-session">Create session</button> <button type="button" onClick={() => setOpen(false)}>Cancel</button>
      <Err err={err} />
    </form>
  )
}

// Tokens sums the model usage the session's log records (each
// session.model_request_ended), read again when the session changes.
function Tokens({ id, updated }) {
  const [t] = useLoad(async () => {
    let inTok = 0, outTok = 0, after = 0
    for (;;) {
      const page = await get(`/v1/sessions/${esc(id)}/events?after=${after}&limit=1000`)
      for (const ev of page.events) {
        if (ev.type === 'session.model_request_ended' && ev.payload.usage) {
          inTok += ev.payload.usage.input_tokens
          outTok += ev.payload.usage.output_tokens
        }
      }
      if (page.events.length < 1000) return { inTok, outTok }
      after = page.next - 1
    }
  }, [id, updated])
  return <span data-testid="tokens">{t ? `${t.inTok} in / ${t.outTok} out` : '…'}</span>
}

function summary(ev) {
  const p = ev.payload || {}
  switch (ev.type) {
    case 'session.status': return p.status + (p.reason ? ' — ' + p.reason : '')
    case 'session.user_message': return p.text
    case 'session.assistant_message': return (p.text || '') + (p.tool_calls ? ` [${p.tool_calls.map((c) => c.name).join(', ')}]` : '')
    case 'session.tool_call': return p.name
    case 'session.tool_started': return `${p.tool_call_id} attempt ${p.attempt}`
    case 'session.tool_result': return `${p.name || p.tool_call_id}: ${(p.output || '').slice(0, 80)}`
    case 'session.checkpointed': return `checkpoint ${p.checkpoint} after #${p.after_seq}`
    case 'session.sandbox_created': return `sandbox ${p.sandbox} (${p.template})`
    case 'session.sandbox_restored': return `sandbox ${p.sandbox} from ${p.checkpoint || 'its template'}: ${p.reason}` + (p.rerun && p.rerun.length ? ` (re-ran ${p.rerun.join(', ')})` : '')
    case 'session.model_request_started': return `call ${p.call} attempt ${p.attempt}` + (p.model ? ` (${p.model})` : '')
    case 'session.model_request_ended': return `call ${p.call}: ${p.usage ? p.usage.input_tokens + ' in / ' + p.usage.output_tokens + ' out' : ''}`
    case 'session.divergence': case 'session.error': return JSON.stringify(p)
    default: return JSON.stringify(p).slice(0, 100)
  }
}

// SessionPage: the session's log, live over SSE (with resume), its
// conversation, tool calls and their results.
export function SessionPage({ id }) {
  const [se, err, reload] = useLoad(() => get('/v1/sessions/' + esc(id)), [id], 5000)
  const [evs, setEvs] = useState([])
  const [delta, setDelta] = useState('')
  const [conn, setConn] = useState('connecting')
  const [msg, setMsg] = useState('')
  const [sendErr, setSendErr] = useState(null)
  const [open, setOpen] = useState(null)
  const need = useNeed('write')
  useEffect(() => {
    setEvs([])
    const stop = followSession(id, 0,
      (ev) => {
        setEvs((xs) => [...xs, ev])
        if (ev.type === 'session.assistant_message') setDelta('')
        if (ev.type === 'session.status' || ev.type === 'session.sandbox_restored') reload()
      },
      (t) => setDelta((d) => d + t),
      (s, detail) => setConn(s === 'error' ? 'error: ' + detail : s))
    return stop
  }, [id])

  const send = async (e) => {
    e.preventDefault()
    try {
      await post('/v1/sessions/' + esc(id) + '/events', { type: 'user_message', payload: { text: msg } })
      setMsg('')
      setSendErr(null)
    } catch (x) { setSendErr(x) }
  }

  const terminate = async () => {
    try {
      await post('/v1/sessions/' + esc(id) + '/events', { type: 'terminate' })
      setSendErr(null); reload()
    } catch (x) { setSendErr(x) }
  }

  let status = se && se.status
  let tokIn = 0, tokOut = 0
  const results = {}
  for (const ev of evs) {
    if (ev.type === 'session.status') status = ev.payload.status
    if (ev.type === 'session.model_request_ended' && ev.payload.usage) { tokIn += ev.payload.usage.input_tokens; tokOut += ev.payload.usage.output_tokens }
    if (ev.type === 'session.tool_result') results[ev.payload.tool_call_id] = ev.payload
  }
  const convo = evs.filter((ev) => ['session.user_message', 'session.assistant_message', 'session.sandbox_restored', 'session.divergence', 'session.error'].includes(ev.type))
  return (
    <section>
      <h2>Session <code>{id}</code> <Badge v={status} /></h2>
      <Err err={err} />
      <div class="facts">
        <span>sandbox {se && se.sandbox ? <Link to={'/sandboxes/' + esc(se.sandbox)} data-testid="session-sandbox">{se.sandbox}</Link> : '–'}</span>
        <span>tokens {tokIn} in / {tokOut} out</span>
        <span>events <b data-testid="event-count">{evs.length}</b></span>
        <span>stream <b data-testid="stream-state" class={'conn-' + conn.split(':')[0]}>{conn}</b></span>
        {status !== 'terminated' && <Confirm testid="terminate" label="Terminate" confirm="Terminate: the agent stops for good" disabled={!!need} title={need || 'End the session (its sandbox is destroyed)'} onYes={terminate} />}
      </div>
      <div class="cols">
        <div class="col">
          <h3>Conversation</h3>
          <div class="convo" data-testid="conversation">
            {convo.map((ev) => {
              const p = ev.payload
              if (ev.type === 'session.user_message') return <div class="bubble user" data-testid="msg-user">{p.text}</div>
              if (ev.type === 'session.assistant_message') return (
                <div class="bubble agent" data-testid="msg-agent">
                  {p.text && <div>{p.text}</div>}
                  {(p.tool_calls || []).map((c) => {
                    const r = results[c.id]
                    return (
                      <div class="tool" data-testid="tool-call">
                        <div class="tool-name">⚙ {c.name} <code>{c.id}</code></div>
                        <pre>{JSON.stringify(c.input, null, 1)}</pre>
                        {r ? <pre class={r.is_error ? 'tool-out err' : 'tool-out'} data-testid="tool-result">{r.output}</pre> : <div class="muted">running…</div>}
                        {r && r.checkpoint && <div class="muted">covered by checkpoint {r.checkpoint}</div>}
                      </div>
                    )
                  })}
                </div>
              )
              if (ev.type === 'session.sandbox_restored') return <div class="bubble sys" data-testid="msg-restored">↺ sandbox restored from {p.checkpoint || 'its template'} ({p.reason}){p.rerun && p.rerun.length ? '; re-ran ' + p.rerun.join(', ') : ''}</div>
              return <div class="bubble sys err">{ev.type}: {JSON.stringify(p)}</div>
            })}
            {delta && <div class="bubble agent live" data-testid="delta">{delta}</div>}
          </div>
          <form class="send" onSubmit={send}>
            <input data-testid="msg" placeholder="Message the agent" value={msg} onInput={(e) => setMsg(e.target.value)} />
            <button type="submit" data-testid="send" disabled={!msg || !!need} title={need}>Send</button>
          </form>
          <Err err={sendErr} />
        </div>
        <div class="col">
          <h3>Timeline</h3>
          <ol class="timeline" data-testid="timeline">
            {evs.map((ev) => (
              <li data-testid="event" data-seq={ev.seq} data-type={ev.type} class={'ev ' + ev.type.replace('.', '-')} onClick={() => setOpen(open === ev.seq ? null : ev.seq)}>
                <span class="seq">#{ev.seq}</span>
                <span class="time">{new Date(ev.time).toLocaleTimeString(undefined, { hour12: false })}</span>
                <span class="type">{ev.type.replace('session.', '')}</span>
                <span class="sum">{summary(ev)}</span>
                {open === ev.seq && <pre class="json">{JSON.stringify(ev.payload, null, 2)}</pre>}
              </li>
            ))}
          </ol>
        </div>
      </div>
    </section>
  )
}
