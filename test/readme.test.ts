import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { groupAlive } from './sim/helpers.ts'
import { waitFor } from './support/wait.ts'

/**
 * The README's walkthrough, as a new operator uses it: `npm run demo` (config/demo.yaml, from source)
 * on free ports, and the block of the "Set up" section pasted whole into bash. curl is wrapped to
 * report each request's status on stderr, so every step is checked without changing the block.
 */
const ROOT = resolve(import.meta.dir, '..')

/** setUpBlock: the README's "Set up" code block that loads a model. */
function setUpBlock(): string {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const start = readme.indexOf('\n## Set up\n')
  const end = readme.indexOf('\n## ', start + 1)
  const section = readme.slice(start, end)
  const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!)
  const block = blocks.find((b) => b.includes('/api/v1/models/load'))
  if (!block) throw new Error('README "Set up" has no block that loads a model')
  return block
}

/** freePort: a port nothing listens on now (the OS's choice for port 0). */
function freePort(): number {
  const s = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const { port } = s
  s.stop(true)
  return port
}

const dir = mkdtempSync(join(tmpdir(), 'modelgate-readme-'))
const port = freePort()
const routerPort = freePort()
let demo: Subprocess<'ignore', 'pipe', 'pipe'>
let demoLog = ''

beforeAll(async () => {
  demo = Bun.spawn([process.execPath, 'src/main.ts', 'serve', '--config', 'config/demo.yaml'], {
    cwd: ROOT,
    env: {
      ...process.env,
      MODELGATE_PORT: String(port),
      MODELGATE_ROUTER_PORT: String(routerPort),
      MODELGATE_DATA_DIR: join(dir, 'data'),
      MODELGATE_SIM_DIR: join(dir, 'sim'),
      MODELGATE_LOG_LEVEL: 'warn',
      SIM_LOAD_DELAY_MS: '300',
      SIM_TOKENS_PER_SEC: '200',
    },
    stdout: 'pipe',
    stderr: 'pipe',
    detached: true,
  })
  void new Response(demo.stderr).text().then((t) => {
    demoLog += t
  })
  await waitFor(
    'the demo to be ready',
    async () => {
      if (demo.exitCode !== null) throw new Error(`the demo exited ${demo.exitCode}: ${demoLog}`)
      return (await fetch(`http://127.0.0.1:${port}/api/health/ready`).catch(() => null))?.ok
    },
    { timeoutMs: 30_000 },
  )
})

/** stopDemo: SIGTERM, as Ctrl-C does; a clean stop unloads every engine before the demo exits. */
async function stopDemo(): Promise<void> {
  if (demo.exitCode !== null) return
  demo.kill('SIGTERM')
  await waitFor('the demo to exit', () => demo.exitCode !== null, {
    timeoutMs: 20_000,
    wake: (notify) => {
      void demo.exited.then(notify)
      return () => {}
    },
  })
}

afterAll(async () => {
  if (demo) await stopDemo().catch(() => undefined)
  // Only if the demo outlived its deadline: nothing of its group may stay behind.
  if (demo && groupAlive(demo.pid)) process.kill(-demo.pid, 'SIGKILL')
  rmSync(dir, { recursive: true, force: true })
})

describe("the README's Set up walkthrough", () => {
  it('loads, waits for active, chats, sleeps and shows the router the same model asleep, pasted whole', async () => {
    // curl reports `step: <status> <method> <url>` on stderr for each request the block makes.
    const wrapper = `curl() { command curl -w '%{stderr}\\nstep: %{http_code} %{method} %{url_effective}\\n' "$@"; }\n`
    // A literal demo address in the block is moved to this demo's ports as the variables move the rest.
    const block = setUpBlock()
      .replace(/(localhost|127\.0\.0\.1):3000\b/g, `127.0.0.1:${port}`)
      .replace(/(localhost|127\.0\.0\.1):8080\b/g, `127.0.0.1:${routerPort}`)
    const run = Bun.spawn(['bash', '-c', wrapper + block], {
      env: { ...process.env, MODELGATE_PORT: String(port), MODELGATE_ROUTER_PORT: String(routerPort) },
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const timer = setTimeout(() => run.kill('SIGKILL'), 90_000)
    const [out, err, code] = await Promise.all([
      new Response(run.stdout).text(),
      new Response(run.stderr).text(),
      run.exited,
    ])
    clearTimeout(timer)
    expect(code).toBe(0)
    const gw = `http://127.0.0.1:${port}`
    // The one instance the block loaded, as the API lists it.
    const listed = (await (await fetch(`${gw}/api/v1/models`)).json()) as { models: { id: string }[] }
    expect(listed.models.length).toBe(1)
    const id = listed.models[0]!.id
    const steps = err
      .split('\n')
      .filter((l) => l.startsWith('step: '))
      .map((l) => l.slice('step: '.length))
      .map((l) =>
        l.replace(gw, '$GW').replace(`http://127.0.0.1:${routerPort}`, '$ROUTER').replace(id!, '$ID'),
      )
    // The wait polled until active: one or more reads of the instance, all 200.
    const polls = steps.filter((s) => s === '200 GET $GW/api/v1/models/$ID').length
    expect(steps).toEqual([
      '202 POST $GW/api/v1/models/load',
      ...Array(polls).fill('200 GET $GW/api/v1/models/$ID'),
      '200 GET $GW/api/memory/usage/multi-gpu',
      '200 POST $GW/v1/chat/completions',
      '200 POST $GW/api/models/instances/$ID/sleep?level=1',
      '200 GET $ROUTER/sleep/status',
    ])
    expect(polls).toBeGreaterThanOrEqual(1)
    const lines = out.split('\n')
    expect(lines).toContain(`instance ${id}`)
    // The statuses it printed end with active, the chat streamed to its end, the router sees it asleep.
    expect(lines.filter((l) => /^(starting|active)$/.test(l)).at(-1)).toBe('active')
    expect(out).toContain('data: [DONE]')
    const routerView = JSON.parse(lines.filter((l) => l.startsWith('{"models"')).at(-1)!) as {
      models: Record<string, { status: string; sleep_level?: number }>
    }
    expect(routerView.models['Qwen/Qwen2.5-7B-Instruct']?.status).toBe('sleeping')
  }, 120_000)

  it('leaves no engine behind when the demo stops', async () => {
    const listed = (await (await fetch(`http://127.0.0.1:${port}/api/v1/models`)).json()) as {
      models: { process_id: number | null }[]
    }
    const pids = listed.models.map((m) => m.process_id).filter((p): p is number => p !== null)
    expect(pids.length).toBe(1)
    await stopDemo()
    expect(demo.exitCode).toBe(0)
    expect(pids.filter(groupAlive)).toEqual([])
  }, 30_000)
})
