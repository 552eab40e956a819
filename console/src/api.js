// The console's API client: the public REST API, the key as a Bearer
// header on every call (never in a URL). The key lives in sessionStorage:
// it is gone when the tab closes.

const KEY = 'amber.key'

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message)
    this.status = status
    this.kind = kind
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY) || ''
}

export function saveKey(k) {
  if (k) sessionStorage.setItem(KEY, k)
  else sessionStorage.removeItem(KEY)
}

function headers(extra) {
  return { Authorization: 'Bearer ' + storedKey(), ...extra }
}

async function fail(res) {
  let kind = '', msg = res.statusText
  try {
    const b = await res.json()
    if (b && b.error) { kind = b.error.kind; msg = b.error.message }
  } catch (_) { /* not JSON */ }
  if (res.status === 401) window.dispatchEvent(new CustomEvent('amber-unauthenticated', { detail: msg }))
  throw new ApiError(res.status, kind, msg)
}

// call sends a JSON request and returns the decoded answer (null for 204).
export async function call(method, path, body) {
  const init = { method, headers: headers(body !== undefined ? { 'Content-Type': 'application/json' } : {}) }
  if (body !== undefined) init.body = JSON.stringify(body)
  const res = await fetch(path, init)
  if (!res.ok) await fail(res)
  if (res.status === 204) return null
  const ct = res.headers.get('Content-Type') || ''
  return ct.includes('json') ? res.json() : res.text()
}

export const get = (p) => call('GET', p)
export const post = (p, b) => call('POST', p, b === undefined ? {} : b)

// text GETs a body as text (a file's content).
export async function text(path) {
  const res = await fetch(path, { headers: headers() })
  if (!res.ok) await fail(res)
  return res.text()
}

// operation runs a long call (restore, recover, checkpoint) as NDJSON
// frames: onProgress gets each progress frame; it resolves with the
// result frame and rejects with the error frame.
export async function operation(path, body, onProgress) {
  const res = await fetch(path, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json', Accept: 'application/x-ndjson' }),
    body: JSON.stringify(body || {}),
  })
  if (!res.ok) await fail(res)
  let last = null
  await readLines(res.body, (line) => {
    if (!line.trim()) return
    const fr = JSON.parse(line)
    if (fr.progress) onProgress && onProgress(fr.progress)
    else last = fr
  })
  if (!last) throw new ApiError(0, 'unavailable', 'the operation ended without a result')
  if (last.error) throw new ApiError(0, last.error.kind, last.error.message)
  return last
}

async function readLines(body, onLine) {
  const rd = body.getReader()
  const dec = new TextDecoder()
  let buf = ''
  for (;;) {
    const { value, done } = await rd.read()
    if (done) break
    buf += dec.decode(value, { stream: true })
    let i
    while ((i = buf.indexOf('\n')) >= 0) {
      onLine(buf.slice(0, i))
      buf = buf.slice(i + 1)
    }
  }
  if (buf) onLine(buf)
}

// followSession follows a session's log over Server-Sent Events, with
// fetch (EventSource cannot send the Authorization header). Durable events
// carry an id (their seq); after a cut stream it reconnects with
// Last-Event-ID = the last seq it saw, so nothing is missed or seen twice.
// onEvent(ev) gets each durable event, onDelta(text) the live text of a
// model answer, onState('live'|'reconnecting'|'error', detail) the
// connection's state. It returns stop().
export function followSession(id, after, onEvent, onDelta, onState) {
  let last = after || 0
  let stopped = false
  let ctl = null
  const loop = async () => {
    while (!stopped) {
      ctl = new AbortController()
      try {
        const h = headers({ Accept: 'text/event-stream' })
        if (last > 0) h['Last-Event-ID'] = String(last)
        const res = await fetch(`/v1/sessions/${encodeURIComponent(id)}/events/stream`, { headers: h, signal: ctl.signal })
        if (!res.ok) await fail(res)
        onState('live', last)
        let ev = { id: '', event: '', data: '' }
        await readLines(res.body, (line) => {
          if (line.endsWith('\r')) line = line.slice(0, -1)
          if (line === '') {
            if (ev.data) {
              const data = JSON.parse(ev.data)
              if (ev.event === 'session.assistant_delta') onDelta(data.text || '')
              else if (ev.event === 'error') onState('error', data.error && data.error.message)
              else if (ev.id) {
                const seq = Number(ev.id)
                if (seq > last) { last = seq; onEvent(data) }
              }
            }
            ev = { id: '', event: '', data: '' }
            return
          }
          if (line.startsWith(':')) return
          const c = line.indexOf(':')
          const field = c < 0 ? line : line.slice(0, c)
          let val = c < 0 ? '' : line.slice(c + 1)
          if (val.startsWith(' ')) val = val.slice(1)
          if (field === 'data') ev.data += (ev.data ? '\n' : '') + val
          else if (field === 'id') ev.id = val
          else if (field === 'event') ev.event = val
        })
      } catch (e) {
        if (stopped) return
        if (e instanceof ApiError && (e.status === 401 || e.status === 403 || e.status === 404)) {
          onState('error', e.message)
          return
        }
      }
      if (stopped) return
      onState('reconnecting', last)
      await new Promise((r) => setTimeout(r, 1000))
    }
  }
  loop()
  return () => { stopped = true; if (ctl) ctl.abort() }
}

export const esc = encodeURIComponent
