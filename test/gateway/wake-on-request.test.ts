import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import type { InstanceLifecycleEvent } from '../../plugins/gateway/api.ts'
import { plugins } from '../../plugins/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { ConfigError, loadConfig } from '../../src/config/load.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The gateway's /v1 wakes the model it serves (`plugins.gateway.proxy.wake_on_request`), through
 * the model directory's one mechanism for every listener (src/directory): `reject` answers 503 model_sleeping with a
 * Retry-After measured from the model's last wake; `hold` keeps the request (its connection
 * outliving the listener's 1 s idle timeout) until the instance is active, then forwards it. Real
 * sockets, the inference key on, simulated engines that crash if a request reaches them asleep
 * (SIM_SLEEP_INFERENCE=crash) and take 1.5 s to wake from level 1.
 */
const KEY = 'sk-wake-on-request'
const MODEL = 'org/wake-model'
const WAKE_DELAY_MS = 4500 // the simulator wakes from level 1 in a third of it: 1.5 s
const HOLD_TIMEOUT_S = 3

interface Gw {
  th: TestHost
  url: string
  id: string
  pgid: number
  /** wakesBegun: the wake operations the gateway began, from its lifecycle events. */
  wakesBegun: InstanceLifecycleEvent[]
  /** wakeMs: how long each wake took, from its operation's beginning to the instance being active. */
  wakeMs: number[]
  /** operation: the control operation running on the instance now. */
  operation: () => string | null
  stop(): Promise<void>
}

async function admin<T = Record<string, unknown>>(
  gw: { url: string },
  path: string,
  method = 'GET',
  body?: unknown,
): Promise<{ status: number; body: T }> {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    keepalive: false,
    headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T }
}

/** boot: a gateway (1 s idle timeout, inference key on) with one sleep-mode instance active. */
async function boot(ports: [number, number], proxy: string, drainMs = 2000): Promise<Gw> {
  const simDir = mkdtempSync(join(tmpdir(), 'modelgate-wake-sim-'))
  const yaml = gatewayYaml(
    {
      ports,
      drainMs,
      env: { SIM_WAKE_DELAY_MS: String(WAKE_DELAY_MS), SIM_SLEEP_INFERENCE: 'crash' },
      extraYaml: `    proxy: ${proxy}\n`,
    },
    simDir,
  )
  const th = await startHost(yaml, plugins, { INFERENCE_API_KEY: KEY }, undefined, {
    server: { idle_timeout_seconds: 1 },
  })
  const wakesBegun: InstanceLifecycleEvent[] = []
  const wakeMs: number[] = []
  let operation: string | null = null
  th.host.bus.on('gateway.instance.lifecycle', (e) => {
    const c = e.change
    if (c.kind === 'operation') {
      operation = c.running ? c.operation : null
      if (c.operation === 'wake' && c.running) wakesBegun.push(e)
    } else if (c.kind === 'state' && c.previous === 'sleeping' && c.current === 'active') {
      wakeMs.push(e.at - wakesBegun[wakesBegun.length - 1]!.at)
    }
  })
  const gw = { th, url: th.url, id: '', pgid: 0, wakesBegun, wakeMs, operation: () => operation }
  const load = await admin<{ instance_id: string }>(gw, '/api/v1/models/load', 'POST', {
    model_path: MODEL,
    enable_sleep_mode: true,
  })
  expect(load.status).toBe(202)
  gw.id = load.body.instance_id
  const model = await settled(gw, 'active')
  gw.pgid = model.process_id as number
  let stopped: Promise<void> | null = null
  return {
    ...gw,
    stop() {
      stopped ??= th.stop().finally(() => rmSync(simDir, { recursive: true, force: true }))
      return stopped
    },
  }
}

/** settled waits until the instance is in `status` with no operation running (a wake ends after it is active). */
async function settled(
  gw: { th: TestHost; url: string; id: string; operation: () => string | null },
  status: string,
) {
  return waitFor(
    `instance ${gw.id} to be ${status} with no operation running`,
    async () => {
      const r = await admin<{ model: Record<string, unknown> }>(gw, `/api/v1/models/${gw.id}`)
      return r.body.model.status === status && gw.operation() === null ? r.body.model : undefined
    },
    { timeoutMs: 20_000, wake: (notify) => gw.th.host.bus.on('gateway.instance.lifecycle', notify) },
  )
}

async function sleep(gw: Gw, level = 1): Promise<void> {
  const r = await admin(gw, `/api/models/instances/${gw.id}/sleep?level=${level}`, 'POST')
  expect(r.status).toBe(200)
  expect(r.body.status).toBe('sleeping')
}

/** engineLines counts the lines of the engine's own stdout (its access log) containing `needle`. */
async function engineLines(gw: Gw, needle: string): Promise<number> {
  const text = await Bun.file(join(gw.th.dataDir, 'engines', gw.id, 'stdout.log')).text()
  return text.split('\n').filter((l) => l.includes(needle)).length
}

const chatBody = (stream: boolean) =>
  JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'wake up' }], max_tokens: 8, stream })

function chat(gw: Gw, stream: boolean, signal?: AbortSignal): Promise<Response> {
  return fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    keepalive: false,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: chatBody(stream),
    ...(signal ? { signal } : {}),
  })
}

/** streamText: the whole event stream of a 200 answer, with its content deltas. */
async function streamText(res: Response): Promise<{ text: string; content: string }> {
  expect(res.status).toBe(200)
  expect(res.headers.get('content-type')).toContain('text/event-stream')
  const text = await res.text()
  let content = ''
  for (const frame of text.split('\n\n')) {
    if (!frame.startsWith('data: {')) continue
    const chunk = JSON.parse(frame.slice(6)) as { choices: { delta?: { content?: string } }[] }
    content += chunk.choices[0]?.delta?.content ?? ''
  }
  return { text, content }
}

/** heldCount: modelgate_request_hold_seconds_count for the model and outcome, from /metrics. */
async function heldCount(gw: Gw, outcome: string): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`, { keepalive: false })).text()
  const line = text
    .split('\n')
    .find(
      (l) =>
        l.startsWith('modelgate_request_hold_seconds_count{') &&
        l.includes(`model="${MODEL}"`) &&
        l.includes(`outcome="${outcome}"`),
    )
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : 0
}

async function errorOf(res: Response): Promise<{ message: string; type: string; code: string }> {
  return ((await res.json()) as { error: { message: string; type: string; code: string } }).error
}

describe('gateway wake on request: configuration', () => {
  const known = knownPlugins(plugins)
  it('defaults to reject with a 120 s hold deadline', () => {
    const cfg = loadConfig('plugins:\n  gateway: {}\n', {}, known).plugins.get('gateway') as {
      proxy: Record<string, unknown>
    }
    expect(cfg.proxy).toEqual({
      first_byte_timeout_ms: 600000,
      connect_timeout_ms: 5000,
      wake_on_request: 'reject',
      hold_timeout: 120,
    })
  })

  it('names the dotted path of a bad value', () => {
    let problems: string[] = []
    try {
      loadConfig('plugins:\n  gateway:\n    proxy: { wake_on_request: queue, hold_timeout: 0 }\n', {}, known)
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      problems = err.problems
    }
    expect(problems).toContain('plugins.gateway.proxy.hold_timeout: must be an integer >= 1')
    expect(problems.some((p) => p.startsWith('plugins.gateway.proxy.wake_on_request:'))).toBe(true)
  })
})

describe('gateway wake on request: reject', () => {
  let gw: Gw
  beforeAll(async () => {
    gw = await boot([18840, 18849], '{ wake_on_request: reject }')
  })
  afterAll(() => gw?.stop())

  it('answers 503 model_sleeping and starts one wake for many requests; Retry-After is then the measured wake', async () => {
    await sleep(gw)
    const wakesBefore = await engineLines(gw, '"POST /wake_up')
    const refused = await Promise.all(Array.from({ length: 10 }, () => chat(gw, false)))
    for (const res of refused) {
      expect(res.status).toBe(503)
      // No wake measured yet: the gateway's default.
      expect(res.headers.get('retry-after')).toBe('5')
      expect(await errorOf(res)).toMatchObject({ type: 'service_unavailable', code: 'model_sleeping' })
    }
    await settled(gw, 'active')
    expect((await engineLines(gw, '"POST /wake_up')) - wakesBefore).toBe(1)

    // The wake just seen took about 1.5 s: the next reject says so (2 s), not the default.
    const measured = gw.wakeMs[gw.wakeMs.length - 1]!
    expect(measured).toBeGreaterThanOrEqual(WAKE_DELAY_MS / 3)
    await sleep(gw)
    const res = await chat(gw, false)
    expect(res.status).toBe(503)
    expect(await errorOf(res)).toMatchObject({ type: 'service_unavailable', code: 'model_sleeping' })
    expect(res.headers.get('retry-after')).toBe(String(Math.ceil(measured / 1000)))
    expect(Number(res.headers.get('retry-after'))).toBeLessThan(5)
    await settled(gw, 'active')
    const served = await chat(gw, false)
    expect(served.status).toBe(200)
    expect(((await served.json()) as { object: string }).object).toBe('chat.completion')
  })

  // An explicit wake while a request's wake runs: the instance still reports `sleeping`, so the
  // call joins the running wake and answers its result (it used to be 409 OPERATION_IN_PROGRESS).
  it('an explicit wake while a request woke the model joins that wake and answers 200 with woke_at', async () => {
    await sleep(gw)
    const begun = gw.wakesBegun.length
    const wakesBefore = await engineLines(gw, '"POST /wake_up')
    const refused = await chat(gw, false)
    expect(refused.status).toBe(503)
    await waitFor('the wake the request started', () => gw.operation() === 'wake', {
      wake: (notify) => gw.th.host.bus.on('gateway.instance.lifecycle', notify),
    })
    const status = await admin<{ model: { status: string } }>(gw, `/api/v1/models/${gw.id}`)
    expect(status.body.model.status).toBe('sleeping')
    const woke = await admin<{ status: string; woke_at: string }>(
      gw,
      `/api/models/instances/${gw.id}/wake`,
      'POST',
    )
    expect(woke.status).toBe(200)
    expect(woke.body.status).toBe('running')
    expect(Date.parse(woke.body.woke_at)).toBeGreaterThan(0)
    await settled(gw, 'active')
    expect(gw.wakesBegun.length - begun).toBe(1)
    expect((await engineLines(gw, '"POST /wake_up')) - wakesBefore).toBe(1)
  })

  it('still refuses without the inference key, before any wake', async () => {
    await sleep(gw)
    const begun = gw.wakesBegun.length
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      keepalive: false,
      headers: { 'content-type': 'application/json' },
      body: chatBody(false),
    })
    expect(res.status).toBe(401)
    expect((await errorOf(res)).code).toBe('missing_api_key')
    expect(gw.wakesBegun.length).toBe(begun)
  })
})

describe('gateway wake on request: hold', () => {
  let gw: Gw
  beforeAll(async () => {
    gw = await boot([18850, 18859], `{ wake_on_request: hold, hold_timeout: ${HOLD_TIMEOUT_S} }`, 10_000)
  })
  afterAll(() => gw?.stop())

  it('holds concurrent streaming requests through one engine wake and streams each in full', async () => {
    await sleep(gw)
    const wakesBefore = await engineLines(gw, '"POST /wake_up')
    const chatsBefore = await engineLines(gw, '"POST /v1/chat/completions')
    const t0 = performance.now()
    const N = 20
    const answers = await Promise.all(Array.from({ length: N }, () => chat(gw, true).then(streamText)))
    // Held longer than the listener's 1 s idle timeout, and not cut by it.
    expect(performance.now() - t0).toBeGreaterThan(1000)
    for (const a of answers) {
      expect(a.text.endsWith('data: [DONE]\n\n')).toBe(true)
      expect(a.content.length).toBeGreaterThan(0)
    }
    // One wake of the engine; every request reached it after (asleep, it would have crashed).
    expect((await engineLines(gw, '"POST /wake_up')) - wakesBefore).toBe(1)
    expect((await engineLines(gw, '"POST /v1/chat/completions')) - chatsBefore).toBe(N)
    expect(await heldCount(gw, 'awake')).toBe(N)
  })

  it('serves the openai client, without retries, on a sleeping model', async () => {
    await sleep(gw)
    const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 20_000 })
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Count to three' }],
      max_tokens: 6,
      stream: true,
    })
    let text = ''
    let finish: string | null = null
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? ''
      finish = chunk.choices[0]?.finish_reason ?? finish
    }
    expect(text.length).toBeGreaterThan(0)
    expect(finish).not.toBeNull()
  })

  it('answers 503 model_sleeping with Retry-After at hold_timeout; the wake goes on', async () => {
    await sleep(gw)
    // The engine is stopped (SIGSTOP): its wake cannot finish before the deadline.
    process.kill(-gw.pgid, 'SIGSTOP')
    let res: Response
    const t0 = performance.now()
    try {
      res = await chat(gw, true)
    } finally {
      process.kill(-gw.pgid, 'SIGCONT')
    }
    expect(performance.now() - t0).toBeGreaterThanOrEqual(HOLD_TIMEOUT_S * 1000 - 50)
    expect(res.status).toBe(503)
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(await errorOf(res)).toEqual({
      message: `Model '${MODEL}' did not wake up within ${HOLD_TIMEOUT_S} s; retry later`,
      type: 'service_unavailable',
      code: 'model_sleeping',
    })
    expect(await heldCount(gw, 'timeout')).toBe(1)
    await settled(gw, 'active')
  })

  it('drops a held client that goes away; the wake goes on and nothing reaches the engine for it', async () => {
    await sleep(gw)
    const chatsBefore = await engineLines(gw, '"POST /v1/chat/completions')
    const begun = gw.wakesBegun.length
    const leave = new AbortController()
    const gone = chat(gw, true, leave.signal).catch((e: Error) => e.name)
    await waitFor('the wake the request started', () => gw.wakesBegun.length > begun, {
      wake: (notify) => gw.th.host.bus.on('gateway.instance.lifecycle', notify),
    })
    leave.abort()
    expect(await gone).toBe('AbortError')
    await waitFor('the held request to be dropped', async () => (await heldCount(gw, 'client_gone')) === 1, {
      wake: (notify) => gw.th.host.bus.on('proxy.held', notify),
    })
    await settled(gw, 'active')
    expect(gw.wakesBegun.length).toBe(begun + 1)
    expect(await engineLines(gw, '"POST /v1/chat/completions')).toBe(chatsBefore)
  })

  it('counts a held request for the shutdown drain: it is served before the engines stop', async () => {
    await sleep(gw)
    const begun = gw.wakesBegun.length
    const held = chat(gw, true).then(streamText)
    await waitFor('the wake the request started', () => gw.wakesBegun.length > begun, {
      wake: (notify) => gw.th.host.bus.on('gateway.instance.lifecycle', notify),
    })
    const stopping = gw.stop()
    const answer = await held
    expect(answer.text.endsWith('data: [DONE]\n\n')).toBe(true)
    expect(answer.content.length).toBeGreaterThan(0)
    await stopping
  })
})
