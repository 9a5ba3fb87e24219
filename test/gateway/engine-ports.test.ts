import { afterEach, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Server, TCPSocketListener } from 'bun'
import { plugins } from '../../plugins/index.ts'
import { cleanupSims, spawnEngine, tempSimDir } from '../sim/helpers.ts'
import { groupGone, startGateway } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { exclusivelyFree, freePortRange } from '../support/ports.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Engine ports on a host shared by several modelgates (pods), through real sockets with auth on and
 * real engine processes: pods sharing a port range give their engines different ports, a port held
 * by someone else (listening, or bound by an engine still loading) is skipped, and an engine whose
 * port turns out to be answered by someone else fails before anything is routed to it.
 */
const PASSWORD = 'engine-ports-admin'
const KEY = 'sk-engine-ports'
const AUTH = {
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'p'.repeat(40),
  INFERENCE_API_KEY: KEY,
}
const QWEN = 'Qwen/Qwen2.5-7B-Instruct'
const LLAMA = 'meta-llama/Llama-3.1-8B-Instruct'

interface Model {
  id: string
  status: string
  port: number
  process_id: number
  error: string | null
}

/** Pod: a started host with an admin token, and what the test opened beside it. */
interface Pod {
  th: TestHost
  admin: string
}

const cleanups: (() => unknown)[] = []
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f()
  await cleanupSims()
})

async function login(th: TestHost): Promise<Pod> {
  const res = await fetch(`${th.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: PASSWORD }),
  })
  expect(res.status).toBe(200)
  return { th, admin: ((await res.json()) as { token: string }).token }
}

/** pod starts a gateway on simulated GPUs in `simDir` (the host's GPUs, shared by its pods). */
async function pod(ports: [number, number], simDir: string, env: Record<string, string> = {}): Promise<Pod> {
  const gw = await startGateway({ ports, simDir, hostEnv: AUTH, env })
  cleanups.push(() => gw.stop())
  return login(gw)
}

async function load(p: Pod, body: Record<string, unknown>): Promise<{ instance_id: string; port: number }> {
  const res = await fetch(`${p.th.url}/api/v1/models/load`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${p.admin}` },
    body: JSON.stringify(body),
  })
  expect(res.status).toBe(202)
  return (await res.json()) as { instance_id: string; port: number }
}

async function model(p: Pod, id: string): Promise<Model> {
  const res = await fetch(`${p.th.url}/api/v1/models/${id}`, {
    headers: { authorization: `Bearer ${p.admin}` },
  })
  expect(res.status).toBe(200)
  return ((await res.json()) as { model: Model }).model
}

/** statuses records every status an instance takes, from the gateway's bus. */
function statuses(p: Pod, id: string): string[] {
  const seen: string[] = []
  cleanups.push(
    p.th.host.bus.on('gateway.instance.status', (e) => {
      if (e.instance.id === id) seen.push(e.currentStatus)
    }),
  )
  return seen
}

async function settled(p: Pod, id: string, want: string, timeoutMs = 30_000): Promise<Model> {
  let last: Model | undefined
  return waitFor(
    `instance ${id} to be ${want}`,
    async () => {
      last = await model(p, id)
      if (last.status === (want === 'active' ? 'failed' : 'active'))
        throw new Error(`instance ${id} is ${last.status}: ${last.error}`)
      return last.status === want ? last : undefined
    },
    { timeoutMs, wake: (n) => p.th.host.bus.on('gateway.instance.status', n), show: () => last },
  )
}

function chat(p: Pod, name: string): Promise<Response> {
  return fetch(`${p.th.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({
      model: name,
      messages: [{ role: 'user', content: 'who are you?' }],
      max_tokens: 4,
    }),
  })
}

describe('engine ports on a host shared by several modelgates', () => {
  it('gives the engines of two pods sharing a port range different ports, and each chat reaches its own model', async () => {
    const simDir = tempSimDir()
    const range: [number, number] = [18500, 18503]
    const [a, b] = [await pod(range, simDir), await pod(range, simDir)]
    const [qwen, llama] = await Promise.all([
      load(a, { model_path: QWEN, gpu_ids: [0], gpu_memory_utilization: 0.4 }),
      load(b, { model_path: LLAMA, gpu_ids: [1], gpu_memory_utilization: 0.4, max_tokens: 8192 }),
    ])
    expect(qwen.port).not.toBe(llama.port)
    await Promise.all([settled(a, qwen.instance_id, 'active'), settled(b, llama.instance_id, 'active')])
    for (let i = 0; i < 4; i++) {
      for (const [p, name] of [
        [a, QWEN],
        [b, LLAMA],
      ] as const) {
        const res = await chat(p, name)
        expect(res.status).toBe(200)
        expect(((await res.json()) as { model: string }).model).toBe(name)
      }
    }
  }, 60_000)

  it('skips a port another process listens on and one an engine still loading holds bound', async () => {
    const first = freePortRange(4)
    const range: [number, number] = [first, first + 3]
    const listener: TCPSocketListener = Bun.listen({
      hostname: '127.0.0.1',
      port: range[0],
      socket: { data() {} },
    })
    cleanups.push(() => listener.stop(true))
    // A vLLM binds its port before it loads the model and listens only once loaded.
    const loading = await spawnEngine(
      QWEN,
      [],
      { MODELGATE_SIM_DIR: tempSimDir(), SIM_LOAD_DELAY_MS: '60000' },
      range[0] + 1,
    )
    await waitFor(
      `engine ${loading.pid} to hold port ${range[0] + 1} bound`,
      () => !exclusivelyFree(range[0] + 1),
    )
    const p = await pod(range, tempSimDir())
    const { instance_id, port } = await load(p, {
      model_path: LLAMA,
      gpu_ids: [0],
      gpu_memory_utilization: 0.4,
      max_tokens: 8192,
    })
    expect(port).toBe(range[0] + 2)
    expect((await settled(p, instance_id, 'active')).port).toBe(range[0] + 2)
  }, 60_000)

  it('fails an engine whose port someone else answers on, stops its process group and routes nothing there', async () => {
    // A release whose engines set SO_REUSEPORT: the engine starts and listens beside the intruder.
    const p = await pod([18520, 18523], tempSimDir(), {
      SIM_VLLM_VERSION: '0.18.0',
      SIM_LOAD_DELAY_MS: '1500',
    })
    const { instance_id, port } = await load(p, {
      model_path: LLAMA,
      gpu_ids: [0],
      gpu_memory_utilization: 0.4,
      max_tokens: 8192,
    })
    const seen = statuses(p, instance_id)
    // Between the port claim and the engine's bind, another process takes the port.
    let chats = 0
    const intruder: Server<unknown> = Bun.serve({
      hostname: '127.0.0.1',
      port,
      reusePort: true,
      fetch(req) {
        const path = new URL(req.url).pathname
        if (path === '/v1/models') return Response.json({ object: 'list', data: [{ id: 'someone-else' }] })
        if (path === '/v1/chat/completions') chats++
        return Response.json({ model: 'someone-else' })
      },
    })
    cleanups.push(() => intruder.stop(true))
    const failed = await settled(p, instance_id, 'failed')
    expect(failed.error).toContain(`port ${port} is answered by pid ${process.pid}`)
    expect(failed.error).toContain('/v1/models there lists someone-else')
    expect(failed.error).toContain("Nothing was routed there; the engine's process group is stopped.")
    await waitFor(`engine group ${failed.process_id} to be gone`, () => groupGone(failed.process_id))
    expect(seen).not.toContain('active')
    const res = await chat(p, LLAMA)
    expect(res.status).toBe(503)
    expect(chats).toBe(0)
  }, 60_000)

  it('fails an engine whose own socket answers but whose /v1/models does not list its served name', async () => {
    const engine = resolve(import.meta.dir, 'readiness-engine.ts')
    const dataDir = mkdtempSync(join(tmpdir(), 'modelgate-ports-'))
    const th = await startHost(
      `
plugins:
  gateway:
    engine:
      command: ['${process.execPath}', '${engine}']
      env: { READY_LINE: none, SERVED_AS: org/other-model }
      port_range: { start: 18530, end: 18533 }
      startup_timeout_seconds: 30
      stop_grace_seconds: 2
      health_poll_ms: { initial: 50, max: 200 }
    gpu: { smi_command: null }
`,
      plugins,
      AUTH,
      dataDir,
    )
    cleanups.push(
      () => th.stop(),
      () => rmSync(dataDir, { recursive: true, force: true }),
    )
    const p = await login(th)
    const { instance_id, port } = await load(p, { model_path: 'org/ready-1b' })
    const seen = statuses(p, instance_id)
    const failed = await settled(p, instance_id, 'failed')
    expect(failed.error).toContain(
      `the engine on port ${port} does not serve org/ready-1b: /v1/models there lists org/other-model`,
    )
    await waitFor(`engine group ${failed.process_id} to be gone`, () => groupGone(failed.process_id))
    expect(seen).not.toContain('active')
  }, 60_000)
})
