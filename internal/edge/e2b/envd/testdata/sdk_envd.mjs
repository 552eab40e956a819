// Drives Amber's envd with the official e2b SDK, as an E2B program does
// once it holds a sandbox: commands (run, stream, background, stdin,
// connect, list, kill) and files (write, read, list, makeDir, rename,
// remove, exists, getInfo, watchDir). The control plane is not part of
// this check: the Sandbox is built for the sandbox the Go test made, with
// E2B_SANDBOX_URL pointing at the test's envd.
//
// node sdk_envd.mjs <sdk dir holding node_modules/e2b>
// env: E2B_SANDBOX_URL, SANDBOX_ID, ACCESS_TOKEN, ENVD_VERSION
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.argv[2], 'package.json'))
const { Sandbox, CommandExitError } = require('e2b')

function check(ok, what, got) {
  if (!ok) {
    console.error(`FAIL ${what}: ${JSON.stringify(got)}`)
    process.exit(1)
  }
  console.log(`ok ${what}`)
}

const sbx = new Sandbox({
  sandboxId: process.env.SANDBOX_ID,
  envdAccessToken: process.env.ACCESS_TOKEN,
  envdVersion: process.env.ENVD_VERSION,
  sandboxDomain: 'e2b.local',
})

// run: stdout, stderr, exit code, envs, cwd; streamed output callbacks.
let streamed = ''
const r = await sbx.commands.run('echo "$GREETING"; pwd; echo warn >&2', {
  envs: { GREETING: 'hello from e2b' }, cwd: '/tmp', onStdout: (d) => { streamed += d },
})
check(r.exitCode === 0 && r.stdout === 'hello from e2b\n/tmp\n' && r.stderr === 'warn\n', 'commands.run', r)
check(streamed === r.stdout, 'onStdout streams', streamed)

// A failing command throws CommandExitError with its code.
try {
  await sbx.commands.run('exit 4')
  check(false, 'exit 4 throws', 'no error')
} catch (e) {
  check(e instanceof CommandExitError && e.exitCode === 4, 'CommandExitError', { name: e.name, code: e.exitCode, msg: e.message })
}

// Background with stdin, list, sendStdin, connect, kill.
const bg = await sbx.commands.run('echo started; while read l; do echo "echo: $l"; done', { background: true, stdin: true })
check(bg.pid > 0, 'background pid', bg.pid)
const listed = await sbx.commands.list()
check(listed.some((p) => p.pid === bg.pid) && !listed.some((p) => p.pid === 1), 'commands.list', listed)
await sbx.commands.sendStdin(bg.pid, 'ping\n')
let attached = ''
const again = await sbx.commands.connect(bg.pid, { onStdout: (d) => { attached += d } })
for (let i = 0; i < 100 && !attached.includes('echo: ping'); i++) await new Promise((res) => setTimeout(res, 50))
check(attached.includes('started') && attached.includes('echo: ping'), 'commands.connect re-attaches', attached)
check(await sbx.commands.kill(bg.pid) === true, 'commands.kill', true)
try {
  await again.wait()
  check(false, 'a killed command ends with an error', 'no error')
} catch (e) {
  check(e instanceof CommandExitError, 'a killed command ends', { name: e.name, msg: e.message })
}
check(await sbx.commands.kill(999999) === false, 'kill of an unknown pid is false', false)

// Files.
const dir = '/tmp/sdk-files'
const w = await sbx.files.write(`${dir}/a/hello.txt`, 'hi there')
check(w.path === `${dir}/a/hello.txt`, 'files.write', w)
check(await sbx.files.read(`${dir}/a/hello.txt`) === 'hi there', 'files.read', null)
const many = await sbx.files.write([{ path: `${dir}/b.txt`, data: 'b' }, { path: `${dir}/c.txt`, data: new Uint8Array([1, 2, 3]) }])
check(many.length === 2, 'files.write many', many)
const bytes = await sbx.files.read(`${dir}/c.txt`, { format: 'bytes' })
check(bytes.length === 3 && bytes[2] === 3, 'files.read bytes', Array.from(bytes))
check(await sbx.files.makeDir(`${dir}/d`) === true, 'files.makeDir', true)
check(await sbx.files.makeDir(`${dir}/d`) === false, 'files.makeDir existing is false', false)
const ls = await sbx.files.list(dir)
check(ls.map((e) => e.name).sort().join(',') === 'a,b.txt,c.txt,d', 'files.list', ls.map((e) => e.name))
const info = await sbx.files.getInfo(`${dir}/b.txt`)
check(info.type === 'file' && info.size === 1, 'files.getInfo', info)
const moved = await sbx.files.rename(`${dir}/b.txt`, `${dir}/d/b2.txt`)
check(moved.path === `${dir}/d/b2.txt`, 'files.rename', moved)
check(await sbx.files.exists(`${dir}/b.txt`) === false && await sbx.files.exists(`${dir}/d/b2.txt`) === true, 'files.exists', null)
await sbx.files.remove(`${dir}/d`)
check(await sbx.files.exists(`${dir}/d`) === false, 'files.remove', null)

// watchDir sees a write.
const events = []
const wh = await sbx.files.watchDir(dir, (e) => events.push(e))
await sbx.files.write(`${dir}/watched.txt`, 'x')
for (let i = 0; i < 100 && !events.some((e) => e.name === 'watched.txt'); i++) await new Promise((res) => setTimeout(res, 50))
await wh.stop()
check(events.some((e) => e.name === 'watched.txt'), 'files.watchDir', events)
console.log('ALL OK')
