// An ordinary E2B program, run unchanged against Amber: only the
// environment says where (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL).
// Two sandboxes; cmd/amber's TestE2EE2B runs it in two phases around a
// daemon crash:
//
//   PHASE=before  create two sandboxes (metadata, envs, timeout), run a
//                 command, stream its output, start a background HTTP
//                 server and fetch through getHost, write and read files,
//                 start a counter that keeps a random number in memory,
//                 list by metadata and state, set a timeout, pause the
//                 first; their ids and counters go to STATE_FILE
//   (the test kills the daemon with SIGKILL and starts it again)
//   PHASE=after   connect to both (the paused one is resumed): the same
//                 counter processes still run with the same in-memory
//                 number, the files are there; then kill both
//
// env: PHASE, STATE_FILE, DAEMON_ADDR (host:port the daemon listens on:
// getHost names a sandbox's port, which this program reaches through the
// daemon with that Host, as a wildcard DNS name would).
import { FileNotFoundError, Sandbox } from 'e2b'
import fs from 'node:fs'
import http from 'node:http'

const check = (ok, what, got) => {
  if (!ok) {
    console.error(`FAIL ${what}: ${JSON.stringify(got)}`)
    process.exit(1)
  }
  console.log(`ok ${what}`)
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// GET http://<host>/path through the daemon (the host is getHost's).
const fetchVia = (host, path) => new Promise((resolve, reject) => {
  const [h, p] = process.env.DAEMON_ADDR.split(':')
  const req = http.get({ host: h, port: Number(p), path, headers: { Host: host } }, (res) => {
    let body = ''
    res.on('data', (d) => { body += d })
    res.on('end', () => resolve({ status: res.statusCode, body }))
  })
  req.on('error', reject)
})

// The counter file is replaced by a rename, never truncated in place: a
// read between a truncate and the write saw an empty file (flaky).
const COUNTER = 'R=$(od -An -N4 -tu4 /dev/urandom | tr -d " "); i=0; while :; do i=$((i+1)); echo "$R $i" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done'
// readCounter waits (up to 5 s) for the counter's first write.
const readCounter = async (sbx) => {
  for (let i = 0; ; i++) {
    try {
      const [r, n] = (await sbx.files.read('/tmp/counter')).trim().split(' ')
      return { r, n: Number(n) }
    } catch (e) {
      if (i >= 50 || !(e instanceof FileNotFoundError)) throw e
      await new Promise((res) => setTimeout(res, 100))
    }
  }
}

const run = process.env.RUN_TAG || `run-${Date.now()}`

if (process.env.PHASE === 'before') {
  const made = []
  for (const name of ['a', 'b']) {
    const sbx = await Sandbox.create({ metadata: { suite: run, name }, envs: { WHO: name }, timeoutMs: 600_000 })
    check(/^sbx-/.test(sbx.sandboxId), `create ${name}`, sbx.sandboxId)

    const out = await sbx.commands.run('echo "hello $WHO"; echo oops >&2; python3 -c "print(6*7)"')
    check(out.exitCode === 0 && out.stdout === `hello ${name}\n42\n` && out.stderr === 'oops\n', `run in ${name}`, out)

    const chunks = []
    await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done', { onStdout: (d) => chunks.push(d) })
    check(chunks.join('') === 'line1\nline2\nline3\n' && chunks.length >= 2, `stream output in ${name}`, chunks)

    await sbx.files.write('/root/note.txt', `note of ${name}`)
    check(await sbx.files.read('/root/note.txt') === `note of ${name}`, `write/read a file in ${name}`, null)

    await sbx.files.write('/srv/index.html', `served by ${name}`)
    const srv = await sbx.commands.run('cd /srv && python3 -m http.server 8000', { background: true })
    let got = { status: 0 }
    for (let i = 0; i < 100 && got.status !== 200; i++) {
      await sleep(100)
      got = await fetchVia(sbx.getHost(8000), '/index.html').catch((e) => ({ status: 0, body: String(e) }))
    }
    check(got.status === 200 && got.body === `served by ${name}`, `background server through getHost in ${name}`, got)
    await sbx.commands.kill(srv.pid)

    // timeoutMs 0: a command's timeout (60 s by default) would end it, as in E2B.
    const counter = await sbx.commands.run(COUNTER, { background: true, timeoutMs: 0 })
    await sleep(500)
    made.push({ id: sbx.sandboxId, pid: counter.pid, counter: await readCounter(sbx) })
  }

  const listed = await Sandbox.list({ query: { metadata: { suite: run } } }).nextItems()
  check(listed.length === 2 && listed.every((s) => s.state === 'running' && s.metadata.suite === run), 'list by metadata', listed)
  const justB = await Sandbox.list({ query: { metadata: { suite: run, name: 'b' } } }).nextItems()
  check(justB.length === 1 && justB[0].sandboxId === made[1].id, 'list by two pairs', justB)

  await Sandbox.setTimeout(made[1].id, 900_000)
  const info = await Sandbox.getInfo(made[1].id)
  check(info.endAt.getTime() > Date.now() + 800_000 && info.metadata.name === 'b', 'setTimeout and getInfo', info)

  const a = await Sandbox.connect(made[0].id)
  check(await a.pause() === true, 'pause a', null)
  const paused = await Sandbox.list({ query: { metadata: { suite: run }, state: ['paused'] } }).nextItems()
  check(paused.length === 1 && paused[0].sandboxId === made[0].id, 'list paused', paused)
  const running = await Sandbox.list({ query: { metadata: { suite: run }, state: ['running'] } }).nextItems()
  check(running.length === 1 && running[0].sandboxId === made[1].id, 'list running', running)

  fs.writeFileSync(process.env.STATE_FILE, JSON.stringify({ run, made }))
  console.log('BEFORE OK')
  process.exit(0) // the counters' streams would keep the program waiting
} else if (process.env.PHASE === 'after') {
  const { run: tag, made } = JSON.parse(fs.readFileSync(process.env.STATE_FILE, 'utf8'))
  for (const [i, m] of made.entries()) {
    const sbx = await Sandbox.connect(m.id, { timeoutMs: 300_000 })
    const procs = await sbx.commands.list()
    check(procs.some((p) => p.pid === m.pid), `the counter of ${i ? 'b' : 'a'} is still there`, procs)
    await sleep(300)
    const now = await readCounter(sbx)
    check(now.r === m.counter.r && now.n > m.counter.n, `its memory came back (${m.counter.r} ${m.counter.n} -> ${now.n})`, now)
    check(await sbx.files.read('/root/note.txt') === `note of ${i ? 'b' : 'a'}`, 'its files came back', null)
  }
  const listed = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
  check(listed.length === 2 && listed.every((s) => s.state === 'running'), 'both running after connect', listed)
  for (const m of made) check(await Sandbox.kill(m.id) === true, `kill ${m.id}`, null)
  check(await Sandbox.kill(made[0].id) === false, 'a second kill finds nothing', null)
  const gone = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
  check(gone.length === 0, 'none listed after kill', gone)
  console.log('AFTER OK')
  process.exit(0)
} else {
  console.error('set PHASE=before or PHASE=after')
  process.exit(2)
}
