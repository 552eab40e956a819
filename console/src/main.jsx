import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { get, storedKey, saveKey } from './api.js'
import { Err, Link, KeyInfo } from './ui.jsx'
import { Sessions, SessionPage } from './sessions.jsx'
import { Sandboxes, SandboxPage } from './sandboxes.jsx'
import { Admin } from './admin.jsx'
import './style.css'

function useHash() {
  const [h, setH] = useState(location.hash.slice(1) || '/sessions')
  useEffect(() => {
    const on = () => setH(location.hash.slice(1) || '/sessions')
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  return h
}

function SignIn({ onIn, why }) {
  const [key, setKey] = useState('')
  const [err, setErr] = useState(null)
  const submit = async (e) => {
    e.preventDefault()
    saveKey(key.trim())
    try {
      const info = await get('/v1/info')
      onIn(info)
    } catch (x) {
      saveKey('')
      setErr(x)
    }
  }
  return (
    <div class="signin">
      <h1>Amber</h1>
      <p>Sign in with an API key. It is kept in this tab only (sessionStorage) and sent as a Bearer header.</p>
      {!err && why && <div class="error" data-testid="error">{why}</div>}
      <form onSubmit={submit}>
        <input type="password" data-testid="key" placeholder="amber_…" value={key} onInput={(e) => setKey(e.target.value)} autoFocus />
        <button type="submit" data-testid="signin">Sign in</button>
      </form>
      <Err err={err} />
    </div>
  )
}

function App() {
  const [info, setInfo] = useState(null)
  const [admin, setAdmin] = useState(false)
  const [checked, setChecked] = useState(!storedKey())
  const [why, setWhy] = useState('')
  const route = useHash()

  useEffect(() => {
    if (storedKey()) get('/v1/info').then(setInfo, () => saveKey('')).finally(() => setChecked(true))
    const out = (e) => { saveKey(''); setInfo(null); setWhy('Signed out: ' + e.detail) }
    addEventListener('amber-unauthenticated', out)
    return () => removeEventListener('amber-unauthenticated', out)
  }, [])
  useEffect(() => {
    if (!info) return
    // Admin pages only for a key that may list tenants (scope admin).
    get('/v1/tenants').then(() => setAdmin(true), () => setAdmin(false))
  }, [info])

  if (!checked) return null
  if (!info) return <SignIn onIn={(i) => { setWhy(''); setInfo(i) }} why={why} />
  const parts = route.split('/').filter(Boolean)
  let page
  if (parts[0] === 'sessions' && parts[1]) page = <SessionPage id={decodeURIComponent(parts[1])} />
  else if (parts[0] === 'sandboxes' && parts[1]) page = <SandboxPage id={decodeURIComponent(parts[1])} tab={parts[2]} />
  else if (parts[0] === 'sandboxes') page = <Sandboxes />
  else if (parts[0] === 'admin') page = admin ? <Admin tab={parts[1]} sel={parts[2] && decodeURIComponent(parts[2])} /> : <div class="error">The admin pages need a key with scope admin.</div>
  else page = <Sessions />
  const on = (p) => (parts[0] === p ? 'on' : '')
  return (
    <KeyInfo.Provider value={info}>
    <div class="app">
      <nav>
        <b class="logo">Amber</b>
        <Link to="/sessions" class={on('sessions')} data-testid="nav-sessions">Sessions</Link>
        <Link to="/sandboxes" class={on('sandboxes')} data-testid="nav-sandboxes">Sandboxes</Link>
        {admin && <Link to="/admin" class={on('admin')} data-testid="nav-admin">Admin</Link>}
        <span class="who" data-testid="tenant">tenant <b>{info.tenant}</b> · key {info.key} ({(info.scopes || []).join(', ')}) · {info.driver} · {info.version}</span>
        <button class="link" data-testid="signout" onClick={() => { saveKey(''); setInfo(null) }}>Sign out</button>
      </nav>
      <main>{page}</main>
    </div>
    </KeyInfo.Provider>
  )
}

render(<App />, document.getElementById('app'))
