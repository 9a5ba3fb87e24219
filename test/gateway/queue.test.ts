import { afterEach, describe, expect, it } from 'bun:test'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A catalogued model's queue while it loads on demand (src/directory hold-queue.ts, the gateway's
 * residency), through real sockets with auth on: simulated engines on simulated 80 GB GPUs, each
 * catalogued model claiming 60 % of a GPU, inference keys made through the admin API.
 */
const STATIC_KEY = 'sk-queue-tests'
const AUTH = {
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: 'queue-password',
  JWT_SECRET: 'queue-jwt-secret-of-at-least-32-bytes-long',
  INFERENCE_API_KEY: STATIC_KEY,
}

const gateways: TestGateway[] = []
afterEach(async () => {
  for (const gw of gateways.splice(0)) await gw.stop()
})

function catalogYaml(names: string[], residency: string): string {
  const lines = names.map(
    (n) =>
      `      - { name: ${n}, model_path: org/${n}-7b, gpu_memory_utilization: 0.6, enable_sleep_mode: true }`,
  )
  return `    residency: { ${residency} }\n    catalog:\n${lines.join('\n')}\n`
}

async function boot(
  names: string[],
  o: { ports: [number, number]; env?: Record<string, string>; residency?: string; extraYaml?: string },
) {
  const gw = await startGateway({
    ports: o.ports,
    gpus: '2x80',
    env: { SIM_LOAD_DELAY_MS: '300', ...o.env },
    hostEnv: AUTH,
    extraYaml:
      catalogYaml(names, o.residency ?? 'policy: cost, min_resident_seconds: 0') + (o.extraYaml ?? ''),
  })
  gateways.push(gw)
  const token = (await gw.host.auth.issueToken('ops', ['admin'])).token
  const createKey = async (fields: Record<string, unknown>): Promise<string> => {
    const res = await fetch(`${gw.url}/api/keys`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify(fields),
    })
    expect(res.status).toBe(201)
    return ((await res.json()) as { key: string }).key
  }
  return { gw, token, createKey }
}

function chat(url: string, key: string, model: string, signal?: AbortSignal): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    ...(signal ? { signal } : {}),
  })
}

async function code(res: Response): Promise<string> {
  return ((await res.json()) as { error: { code: string } }).error.code
}

describe("a model's queue while it loads", () => {
  it("one key's flood leaves room in the queue for another key", async () => {
    const { gw, createKey } = await boot(['shared'], {
      ports: [19800, 19819],
      env: { SIM_LOAD_DELAY_MS: '8000' },
      residency: 'policy: cost, min_resident_seconds: 0, max_queue: 4',
    })
    const flooder = await createKey({ name: 'flooder' })
    const other = await createKey({ name: 'other' })
    const flood = Array.from({ length: 10 }, () => chat(gw.url, flooder, 'shared'))
    // Half the queue is the flooder's: the rest of its flood is refused at once.
    const refused: Response[] = []
    for (const r of flood)
      void r.then((res) => {
        if (res.status === 429) refused.push(res)
      })
    await waitFor('the flood beyond its share refused', () => refused.length === 8)
    expect(gw.host.directory.held('shared')).toBe(2)
    for (const r of refused) expect(await code(r)).toBe('queue_full')
    // Another key still finds a place, and is served once the model loads.
    const asked = chat(gw.url, other, 'shared')
    await waitFor('the other key queued', () => gw.host.directory.held('shared') === 3)
    const res = await asked
    expect(res.status).toBe(200)
    const served = (await Promise.all(flood)).filter((r) => r.status === 200)
    expect(served.length).toBe(2)
  }, 60_000)
})

describe('a burst during a cold load', () => {
  it('waits, with the default queue and deadline: 100 requests sent at once are all served', async () => {
    const base = await freePort()
    const { gw } = await boot(['burst'], { ports: [base, base + 9], env: { SIM_LOAD_DELAY_MS: '2000' } })
    const burst = Array.from({ length: 100 }, () => chat(gw.url, STATIC_KEY, 'burst'))
    await waitFor('every request of the burst held', () => gw.host.directory.held('burst') === 100)
    const answers = await Promise.all(burst)
    const statuses = answers.map((r) => r.status)
    expect(statuses.filter((s) => s !== 200)).toEqual([])
    await Promise.all(answers.map((r) => r.text()))
  }, 120_000)
})

describe('a load its last client leaves', () => {
  it('is cancelled, not failed: the next request starts the load again and is served', async () => {
    const { gw } = await boot(['left'], { ports: [19820, 19839], env: { SIM_LOAD_DELAY_MS: '8000' } })
    const gateway = gw.host.api<{ list(): { id: string; status: string; process_id: number | null }[] }>(
      'gateway',
    )
    const client = new AbortController()
    const pending = chat(gw.url, STATIC_KEY, 'left', client.signal).catch(() => null)
    const inst = await waitFor('the load to start', () =>
      gateway.list().find((i) => i.status === 'starting' && i.process_id),
    )
    client.abort()
    await pending
    await waitFor(
      'the load cancelled',
      () => gateway.list().find((i) => i.id === inst.id)?.status !== 'starting',
    )
    // No 502 wake_failed for the next ten seconds: it loads the model again and is served.
    const res = await chat(gw.url, STATIC_KEY, 'left')
    expect(`${res.status} ${res.status === 200 ? '' : await res.text()}`).toBe('200 ')
    expect(gw.host.directory.record('left').recentFailure(performance.now())).toBeNull()
  }, 60_000)
})

describe('the router, for a catalogued model that is loading', () => {
  it('holds the request as the gateway does, and serves it once the model loads (not 404)', async () => {
    const { gw } = await boot(['routed'], {
      ports: [19840, 19859],
      env: { SIM_LOAD_DELAY_MS: '3000' },
      extraYaml: '  router:\n    host: 127.0.0.1\n    port: 0\n    from_gateway: true\n',
    })
    const gateway = gw.host.api<{ list(): { served_model_name: string; status: string }[] }>('gateway')
    const first = chat(gw.url, STATIC_KEY, 'routed')
    await waitFor('the load to start', () =>
      gateway.list().some((i) => i.served_model_name === 'routed' && i.status === 'starting'),
    )
    const routed = chat(gw.host.urls.router!, STATIC_KEY, 'routed')
    // Held while the model loads, not answered (it was 404 model_not_found).
    const early = await Promise.race([
      routed.then((r) => `answered ${r.status}`),
      waitFor('the router request held', () => gw.host.directory.held('routed') === 2).then(() => 'held'),
    ])
    expect(early).toBe('held')
    const res = await routed
    expect(`${res.status} ${res.status === 200 ? '' : await res.text()}`).toBe('200 ')
    expect(((await res.json()) as { model: string }).model).toBe('routed')
    expect((await first).status).toBe(200)
  }, 60_000)
})

describe('the answers of a load that does not serve', () => {
  it('a failed load: every request that waited for it, and the next, get 502 wake_failed with the reason', async () => {
    const { gw } = await boot(['broken'], {
      ports: [19860, 19879],
      env: { SIM_LOAD_DELAY_MS: '1500', SIM_FAIL_START: 'CUDA out of memory at load' },
    })
    const gateway = gw.host.api<{ list(): { served_model_name: string; status: string }[] }>('gateway')
    const first = chat(gw.url, STATIC_KEY, 'broken')
    await waitFor('the load to start', () =>
      gateway.list().some((i) => i.served_model_name === 'broken' && i.status === 'starting'),
    )
    // Queued behind the instance's load, not the catalogue's bring-up.
    const second = chat(gw.url, STATIC_KEY, 'broken')
    await waitFor('both queued', () => gw.host.directory.held('broken') === 2)
    for (const res of [await first, await second, await chat(gw.url, STATIC_KEY, 'broken')]) {
      const body = await res.text()
      expect(`${res.status} ${JSON.parse(body).error.code}`).toBe('502 wake_failed')
      expect(body).toContain('CUDA out of memory at load')
    }
    // One load failed: one line, with the two requests it failed.
    const lines = gw.logs.filter((l) => l.includes('wake on request failed'))
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain('requests=2')
  }, 60_000)

  it('a request queued for a load when the server stops: 503 server_stopping, saying so', async () => {
    const { gw } = await boot(['late'], { ports: [19880, 19899], env: { SIM_LOAD_DELAY_MS: '20000' } })
    const held = chat(gw.url, STATIC_KEY, 'late')
    await waitFor('the request queued', () => gw.host.directory.held('late') === 1)
    gateways.splice(gateways.indexOf(gw), 1)
    const stopping = gw.stop()
    const res = await held
    const error = ((await res.json()) as { error: { code: string; message: string } }).error
    expect(`${res.status} ${error.code}`).toBe('503 server_stopping')
    expect(error.message).toContain('server is stopping')
    expect(res.headers.get('retry-after')).not.toBeNull()
    await stopping
  }, 60_000)
})
