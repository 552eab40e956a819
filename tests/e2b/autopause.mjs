// An ordinary E2B program, run unchanged against Amber: sandboxes that
// reach their timeout. Two sandboxes; cmd/amber's TestE2EE2B runs it in two
// phases around a daemon crash:
//
//   PHASE=before  a: lifecycle onTimeout 'pause' and a 4 s timeout, with a
//                 counter that keeps a random number in memory; b: the
//                 default onTimeout (kill) and a 4 s timeout. a becomes
//                 paused, b is gone (getInfo: not found, kill: false)
//   (the test kills the daemon with SIGKILL and starts it again)
//   PHASE=after   connect to a: it is resumed, the same counter runs on
//                 with its number; kill it
//
// env: PHASE, STATE_FILE.
import { Sandbox, NotFoundError } from 'e2b'
import fs from 'node:fs'

const check = (ok, what, got) => {
  if (!ok) {
    console.error(`FAIL ${what}: ${JSON.stringify(got)}`)
    process.exit(1)
  }
  console.log(`ok ${what}`)
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// Written by rename: a read never meets the file truncated mid-write.
const COUNTER = 'R=$(od -An -N4 -tu4 /dev/urandom | tr -d " "); i=0; while :; do i=$((i+1)); echo "$R $i" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done'
const readCounter = async (sbx) => {
  const [r, n] = (await sbx.files.read('/tmp/counter')).trim().split(' ')
  return { r, n: Number(n) }
}
const gone = async (id) => {
  try {
    await Sandbox.getInfo(id)
    return false
  } catch (e) {
    return e instanceof NotFoundError || /not found/i.test(String(e))
  }
}

if (process.env.PHASE === 'before') {
  const a = await Sandbox.create({ timeoutMs: 4_000, lifecycle: { onTimeout: 'pause' }, metadata: { role: 'autopause' } })
  const b = await Sandbox.create({ timeoutMs: 4_000, metadata: { role: 'autokill' } })
  const infoA = await Sandbox.getInfo(a.sandboxId)
  check(infoA.lifecycle?.onTimeout === 'pause' && infoA.endAt.getTime() <= Date.now() + 4_000, 'a pauses at its timeout', infoA)
  const counter = await a.commands.run(COUNTER, { background: true, timeoutMs: 0 })
  await sleep(500)
  const before = await readCounter(a)
  let state = ''
  for (let i = 0; i < 300 && state !== 'paused'; i++) {
    await sleep(100)
    state = (await Sandbox.getInfo(a.sandboxId)).state
  }
  check(state === 'paused', 'a paused at its timeout', state)
  let bGone = false
  for (let i = 0; i < 300 && !bGone; i++) {
    await sleep(100)
    bGone = await gone(b.sandboxId)
  }
  check(bGone, 'b is gone at its timeout', null)
  check(await Sandbox.kill(b.sandboxId) === false, 'killing b finds nothing', null)
  fs.writeFileSync(process.env.STATE_FILE, JSON.stringify({ id: a.sandboxId, pid: counter.pid, before }))
  console.log('BEFORE OK')
  process.exit(0)
} else if (process.env.PHASE === 'after') {
  const { id, pid, before } = JSON.parse(fs.readFileSync(process.env.STATE_FILE, 'utf8'))
  check((await Sandbox.getInfo(id)).state === 'paused', 'a is still paused after the daemon crash', null)
  const a = await Sandbox.connect(id, { timeoutMs: 300_000 })
  check((await a.commands.list()).some((p) => p.pid === pid), 'its counter is still there', null)
  await sleep(300)
  const now = await readCounter(a)
  check(now.r === before.r && now.n > before.n, `its memory came back (${before.r} ${before.n} -> ${now.n})`, now)
  await a.kill()
  check(await gone(id), 'a is gone', null)
  console.log('AFTER OK')
  process.exit(0)
} else {
  console.error('set PHASE=before or PHASE=after')
  process.exit(2)
}
