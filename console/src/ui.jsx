import { createContext } from 'preact'
import { useContext, useEffect, useState, useCallback } from 'preact/hooks'

// useLoad runs load() now, again when deps change and every `every` ms
// when given; it returns [data, error, reload].
export function useLoad(load, deps, every) {
  const [data, setData] = useState(null)
  const [err, setErr] = useState(null)
  const reload = useCallback(() => {
    load().then((d) => { setData(d); setErr(null) }, (e) => setErr(e))
  }, deps)
  useEffect(() => {
    reload()
    if (!every) return
    const t = setInterval(reload, every)
    return () => clearInterval(t)
  }, [reload])
  return [data, err, reload]
}

export function Err({ err }) {
  if (!err) return null
  return <div class="error" data-testid="error">{err.kind ? err.kind + ': ' : ''}{err.message}</div>
}

export function Badge({ v }) {
  return <span class={'badge b-' + String(v || '').replace(/[^a-z-]/g, '')}>{v}</span>
}

export function Link({ to, children, ...rest }) {
  return <a href={'#' + to} {...rest}>{children}</a>
}

export function when(t) {
  if (!t) return ''
  const d = new Date(t)
  return d.toLocaleString(undefined, { hour12: false })
}

export function bytes(n) {
  if (n == null || n < 0) return '–'
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++ }
  return (i ? n.toFixed(1) : n) + ' ' + u[i]
}

export function short(id) {
  return id && id.length > 14 ? id.slice(0, 14) + '…' : id
}

export function Tabs({ tabs, cur, onPick }) {
  return (
    <div class="tabs">
      {tabs.map((t) => (
        <button class={t === cur ? 'tab on' : 'tab'} data-testid={'tab-' + t.toLowerCase()} onClick={() => onPick(t)}>{t}</button>
      ))}
    </div>
  )
}

// Graph draws a series of numbers as an SVG line with its latest value.
export function Graph({ title, points, fmt, max, testid }) {
  const w = 260, h = 70
  const vals = points.map((p) => p.v)
  const top = Math.max(max || 0, ...vals.map((v) => v * 1.25), 1e-9)
  const step = points.length > 1 ? w / (points.length - 1) : w
  const d = points.map((p, i) => `${i ? 'L' : 'M'}${(i * step).toFixed(1)},${(h - (p.v / top) * (h - 4) - 2).toFixed(1)}`).join(' ')
  const lastV = vals.length ? vals[vals.length - 1] : null
  return (
    <div class="graph" data-testid={testid}>
      <div class="graph-head"><span>{title}</span><b data-testid={testid + '-value'}>{lastV == null ? '–' : fmt(lastV)}</b></div>
      <svg width={w} height={h} viewBox={`0 0 ${w} ${h}`}>
        <rect x="0" y="0" width={w} height={h} class="graph-bg" />
        {points.length > 1 && <path d={d} class="graph-line" />}
      </svg>
      <div class="graph-foot">{points.length} samples{vals.length ? ' · peak ' + fmt(Math.max(...vals)) : ''}</div>
    </div>
  )
}

export function Json({ v }) {
  return <pre class="json">{JSON.stringify(v, null, 2)}</pre>
}

// Who is the signed-in key: GET /v1/info's answer (tenant, key, scopes).
export const KeyInfo = createContext(null)

// useNeed returns '' when the signed-in key holds scope, else why not (a
// disabled button's title). The routes refuse it anyway: this only keeps
// the console from offering what the key cannot do.
export function useNeed(scope) {
  const info = useContext(KeyInfo)
  const has = (info && info.scopes) || []
  if (!info || !info.scopes || has.includes(scope)) return ''
  return `Needs a key with scope ${scope}; this key (${info.key}) has ${has.join(', ') || 'none'}`
}

// Confirm is a two-step button: the first click asks, the second does.
export function Confirm({ label, confirm, onYes, disabled, title, testid }) {
  const [asking, setAsking] = useState(false)
  if (!asking) return <button class="danger" data-testid={testid} disabled={disabled} title={title} onClick={() => setAsking(true)}>{label}</button>
  return (
    <span class="confirm">
      <button class="danger" data-testid={testid + '-yes'} disabled={disabled} onClick={() => { setAsking(false); onYes() }}>{confirm}</button>
      {' '}<button data-testid={testid + '-no'} onClick={() => setAsking(false)}>Cancel</button>
    </span>
  )
}
