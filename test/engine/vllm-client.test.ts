import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Server } from 'bun'
import { EngineCallError, engineOrigin, WakeError, waitHealthy } from '../../src/engine/engine-client.ts'
import { readSleepLevel, readSleepOperationSeconds, VllmClient } from '../../src/engine/vllm-client.ts'
import { freePort } from '../sim/helpers.ts'

/**
 * The one engine control client against a stub engine: answers, deadlines, the caller's signal,
 * the failure words, sleep mode learned from a 404, /tokenize, /metrics, and engines reached
 * directly even with HTTP_PROXY set. engineOrigin: the one way an engine address becomes a URL.
 */
describe('engineOrigin', () => {
  it('reaches wildcard addresses on loopback and brackets IPv6 once', () => {
    expect(engineOrigin('127.0.0.1', 8000)).toBe('http://127.0.0.1:8000')
    expect(engineOrigin('localhost', 8001)).toBe('http://localhost:8001')
    expect(engineOrigin('0.0.0.0', 8002)).toBe('http://127.0.0.1:8002')
    expect(engineOrigin('::', 8003)).toBe('http://[::1]:8003')
    expect(engineOrigin('[::]', 8003)).toBe('http://[::1]:8003')
    expect(engineOrigin('::1', 8004)).toBe('http://[::1]:8004')
    expect(engineOrigin('fe80::1', 8005)).toBe('http://[fe80::1]:8005')
    expect(engineOrigin('[::1]', 8006)).toBe('http://[::1]:8006')
    expect(engineOrigin('[fe80::1]', 8007)).toBe('http://[fe80::1]:8007')
  })
})

/** What the stub engine answers; a path under /hang is never answered. */
let sleepStatus = 200
let tokenizeStatus = 200
let healthStatus = 200
let onHealth = () => {}
const never = new Promise<Response>(() => {})
let engine: Server<undefined>
let url = ''
const seen: string[] = []

beforeAll(() => {
  engine = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(req) {
      const u = new URL(req.url)
      seen.push(`${req.method} ${u.pathname}${u.search}`)
      if (u.pathname.startsWith('/hang/')) return never
      switch (u.pathname) {
        case '/health':
          onHealth()
          return new Response(null, { status: healthStatus })
        case '/is_sleeping':
          return sleepStatus === 200
            ? Response.json({ is_sleeping: true })
            : new Response('Not Found', { status: sleepStatus })
        case '/sleep':
        case '/wake_up':
          return new Response(sleepStatus === 200 ? null : 'Not Found', { status: sleepStatus })
        case '/metrics':
          return new Response(
            '# HELP vllm:kv_cache_usage_perc x\n' +
              'vllm:kv_cache_usage_perc{engine="0"} 0.25\n' +
              'vllm:kv_cache_usage_perc{engine="1"} 0.5\n' +
              'vllm:kv_cache_usage_perc_other 9\n',
          )
        case '/tokenize': {
          if (tokenizeStatus !== 200) return new Response('tokenizer broke', { status: tokenizeStatus })
          const body = (await req.json()) as { model: string; prompt: string }
          if (body.model === 'tokens-only') return Response.json({ tokens: body.prompt.split(' ') })
          return Response.json({ count: body.prompt.split(' ').length + 1, max_model_len: 4096 })
        }
      }
      return new Response('no route', { status: 404 })
    },
  })
  url = `http://127.0.0.1:${engine.port}`
})

afterAll(() => {
  engine.stop(true)
})

const failure = async (p: Promise<unknown>): Promise<EngineCallError> => {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(EngineCallError)
  return err as EngineCallError
}

describe('VllmClient', () => {
  it('probes /health with its round trip, and says why an engine is not healthy', async () => {
    healthStatus = 200
    const ok = await new VllmClient(url).probe()
    expect(ok).toEqual({ ok: true, seconds: expect.any(Number) })
    expect(ok.ok && ok.seconds > 0 && ok.seconds < 5).toBe(true)
    expect(await new VllmClient(url).health(1000)).toBe(true)
    healthStatus = 503
    expect(await new VllmClient(url).probe()).toEqual({ ok: false, error: 'engine /health answered 503' })
    expect(await new VllmClient(url).health()).toBe(false)
    healthStatus = 200
    const nobody = `http://127.0.0.1:${await freePort()}`
    expect(await new VllmClient(nobody).probe({ timeoutMs: 1000 })).toEqual({
      ok: false,
      error: 'connection refused',
    })
  })

  it('ends a call at its deadline or when the caller aborts, with the failure in words', async () => {
    const hung = new VllmClient(`${url}/hang`, 10000, { abortedAs: 'the router is stopping' })
    const late = await failure(hung.isSleeping({ timeoutMs: 100 }))
    expect(late.message).toBe('engine GET /is_sleeping failed: no answer within 100 ms')
    expect(late.status).toBeNull()
    expect(await hung.probe({ timeoutMs: 100 })).toEqual({ ok: false, error: 'no answer within 100 ms' })

    const stop = new AbortController()
    const probe = hung.probe({ signal: stop.signal, timeoutMs: 10000 })
    const sleep = failure(hung.sleep(1, { signal: stop.signal }))
    stop.abort()
    expect(await probe).toEqual({ ok: false, error: 'the router is stopping' })
    expect((await sleep).message).toBe('engine POST /sleep?level=1 failed: the router is stopping')
    const cancelled = await failure(
      new VllmClient(`${url}/hang`).isSleeping({ signal: AbortSignal.abort(), timeoutMs: 10000 }),
    )
    expect(cancelled.message).toBe('engine GET /is_sleeping failed: the call was cancelled')
  })

  it('learns whether the engine has sleep mode from its sleep endpoints', async () => {
    const client = new VllmClient(url)
    expect(client.sleepMode).toBeNull()
    sleepStatus = 200
    expect(await client.isSleeping()).toBe(true)
    expect(client.sleepMode).toBe(true)
    sleepStatus = 404
    const err = await failure(client.isSleeping())
    expect(err.status).toBe(404)
    expect(err.message).toBe('engine GET /is_sleeping answered 404: Not Found')
    expect(client.sleepMode).toBe(false)
    sleepStatus = 200
    await client.sleep(2)
    expect(client.sleepMode).toBe(true)
    await client.wake(['weights', 'kv cache'])
    expect(seen).toContain('POST /sleep?level=2')
    expect(seen).toContain('POST /wake_up?tags=weights&tags=kv%20cache')
    sleepStatus = 404
    await failure(client.sleep(1))
    expect(client.sleepMode).toBe(false)
    sleepStatus = 200
  })

  it('reads a gauge from /metrics, summed over its label sets', async () => {
    const client = new VllmClient(url)
    expect(await client.metric(['vllm:gpu_cache_usage_perc', 'vllm:kv_cache_usage_perc'])).toBe(0.75)
    expect(await client.metric(['vllm:absent'])).toBeNull()
  })

  it("counts a prompt with the engine's /tokenize, and tells an engine without it", async () => {
    const client = new VllmClient(url)
    expect(await client.tokenize('m', 'one two three')).toEqual({ count: 4, maxModelLen: 4096 })
    expect(await client.tokenize('tokens-only', 'one two')).toEqual({ count: 2, maxModelLen: null })
    for (const status of [404, 405, 501]) {
      tokenizeStatus = status
      expect(await client.tokenize('m', 'x')).toBeNull()
    }
    tokenizeStatus = 500
    const err = await failure(client.tokenize('m', 'x'))
    expect(err.message).toBe('engine POST /tokenize answered 500: tokenizer broke')
    expect(err.status).toBe(500)
    tokenizeStatus = 200
  })

  it('reaches the engine directly even with HTTP_PROXY set', async () => {
    let proxied = 0
    const proxy = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch() {
        proxied++
        return new Response('proxy', { status: 502 })
      },
    })
    const keys = ['HTTP_PROXY', 'http_proxy', 'NO_PROXY', 'no_proxy'] as const
    const saved = keys.map((k) => process.env[k])
    try {
      process.env.HTTP_PROXY = process.env.http_proxy = `http://127.0.0.1:${proxy.port}`
      delete process.env.NO_PROXY
      delete process.env.no_proxy
      const client = new VllmClient(url)
      expect(await client.health()).toBe(true)
      expect(await client.isSleeping()).toBe(true)
      expect(await client.tokenize('m', 'a b')).toEqual({ count: 3, maxModelLen: 4096 })
      expect(proxied).toBe(0)
    } finally {
      keys.forEach((k, i) => {
        if (saved[i] === undefined) delete process.env[k]
        else process.env[k] = saved[i]
      })
      proxy.stop(true)
    }
  })
})

describe('waitHealthy', () => {
  it('answers healthy, timeout, or stopped when its signal aborts mid-wait', async () => {
    healthStatus = 200
    const opts = { initialMs: 10, maxMs: 50, deadlineMs: 2000 }
    expect(await waitHealthy(new VllmClient(url), opts)).toBe('healthy')
    healthStatus = 503
    expect(await waitHealthy(new VllmClient(url), { ...opts, deadlineMs: 100 })).toBe('timeout')
    // Aborted once the first probe has been answered: the wait before the next probe ends too.
    const stop = new AbortController()
    onHealth = () => setTimeout(() => stop.abort(), 20)
    // The next probe is 10 minutes away, past the test's own timeout: only the abort ends the wait.
    const waiting = waitHealthy(new VllmClient(url), {
      initialMs: 600_000,
      maxMs: 600_000,
      deadlineMs: 3_600_000,
      signal: stop.signal,
    })
    expect(await waiting).toBe('stopped')
    onHealth = () => {}
    expect(await waitHealthy(new VllmClient(url), { ...opts, stop: () => true })).toBe('stopped')
    healthStatus = 200
  })
})

/**
 * The sleep and wake calls against a stub shaped as vLLM's dev-mode routers
 * (entrypoints/serve/sleep, rpc and cache): what each call sends, in which order, and what a
 * refusal or a failure half-way leaves.
 */
describe('VllmClient sleep and wake sequence', () => {
  let stub: Server<undefined>
  let base = ''
  const calls: string[] = []
  /**
   * how the stub answers: the mode parameter refused (`422` as FastAPI would, or `500` as vLLM's engine
   * core does for a mode it does not know), reload_weights failing, …
   */
  const knobs = {
    refuseMode: false as false | 422 | 500,
    failReload: false,
    resetSuccess: true as boolean | null,
    asleep: new Set<string>(),
    metrics: '',
  }

  beforeAll(() => {
    stub = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      async fetch(req) {
        const u = new URL(req.url)
        const body = req.method === 'POST' ? await req.text() : ''
        calls.push(`${req.method} ${u.pathname}${u.search}${body ? ` ${body}` : ''}`)
        switch (u.pathname) {
          case '/sleep':
            if (knobs.refuseMode === 422 && u.searchParams.has('mode'))
              return Response.json(
                { detail: [{ loc: ['query', 'mode'], msg: 'unexpected', type: 'extra_forbidden' }] },
                { status: 422 },
              )
            if (knobs.refuseMode === 500 && u.searchParams.has('mode'))
              return Response.json(
                {
                  error: {
                    message: `Call to sleep method failed: Invalid pause mode: ${u.searchParams.get('mode')}`,
                    type: 'InternalServerError',
                    param: null,
                    code: 500,
                  },
                },
                { status: 500 },
              )
            knobs.asleep = new Set(['weights', 'kv_cache'])
            return new Response(null, { status: 200 })
          case '/wake_up': {
            // vLLM's executor: a tag that is not asleep wakes nothing of the call, still 200.
            const tags = u.searchParams.getAll('tags')
            if (tags.some((t) => !knobs.asleep.has(t))) return new Response(null, { status: 200 })
            for (const t of tags.length ? tags : ['weights', 'kv_cache']) knobs.asleep.delete(t)
            return new Response(null, { status: 200 })
          }
          case '/is_sleeping':
            return Response.json({ is_sleeping: knobs.asleep.size > 0 })
          case '/collective_rpc':
            if (knobs.failReload) return Response.json({ error: 'disk gone' }, { status: 500 })
            return Response.json({ results: [null, null] })
          case '/reset_prefix_cache':
            return knobs.resetSuccess === null
              ? new Response(null, { status: 200 })
              : Response.json({ success: knobs.resetSuccess })
          case '/metrics':
            return new Response(knobs.metrics)
        }
        return new Response('no route', { status: 404 })
      },
    })
    base = `http://127.0.0.1:${stub.port}`
  })
  afterAll(() => {
    stub.stop(true)
  })
  const fresh = () => {
    calls.length = 0
    knobs.refuseMode = false
    knobs.failReload = false
    knobs.resetSuccess = true
    knobs.asleep = new Set()
    return new VllmClient(base)
  }

  it('asks for mode=wait, and leaves the parameter out once the engine refused it', async () => {
    const client = fresh()
    expect(await client.sleep(1, { mode: 'wait' })).toBe('wait')
    expect(client.sleepModeParam).toBe(true)
    expect(calls).toEqual(['POST /sleep?level=1&mode=wait'])

    const old = fresh()
    knobs.refuseMode = 422
    expect(await old.sleep(2, { mode: 'wait' })).toBeNull()
    expect(old.sleepModeParam).toBe(false)
    expect(await old.sleep(1, { mode: 'wait' })).toBeNull()
    expect(calls).toEqual(['POST /sleep?level=2&mode=wait', 'POST /sleep?level=2', 'POST /sleep?level=1'])
  })

  it("takes vLLM's own refusal of a mode, the engine core's 500 naming it, for a refusal too", async () => {
    const client = fresh()
    knobs.refuseMode = 500
    expect(await client.sleep(1, { mode: 'wait' })).toBeNull()
    expect(client.sleepModeParam).toBe(false)
    expect(calls).toEqual(['POST /sleep?level=1&mode=wait', 'POST /sleep?level=1'])
    expect(knobs.asleep.size).toBe(2)
  })

  it('calls collective_rpc and reset_prefix_cache with their shapes', async () => {
    const client = fresh()
    expect(await client.collectiveRpc('reload_weights')).toEqual([null, null])
    expect(calls).toEqual(['POST /collective_rpc {"method":"reload_weights"}'])
    expect(await client.resetPrefixCache()).toBe(true)
    knobs.resetSuccess = false
    expect(await client.resetPrefixCache()).toBe(false)
    knobs.resetSuccess = null // older builds: 200 with no body
    expect(await client.resetPrefixCache()).toBe(true)
  })

  it('wakes from level 1 with one wake_up, and from level 2 with the reload sequence in order', async () => {
    const one = fresh()
    await one.sleep(1)
    expect(await one.wakeUp(1)).toEqual({ phases: ['wake_up'], sleeping: false })
    expect(calls).toEqual(['POST /sleep?level=1', 'POST /wake_up', 'GET /is_sleeping'])

    const two = fresh()
    await two.sleep(2)
    const heard: string[] = []
    const woke = await two.wakeUp(2, [], { onPhase: (p) => heard.push(p) })
    expect(woke).toEqual({
      phases: ['weights', 'reload_weights', 'kv_cache', 'reset_prefix_cache'],
      sleeping: false,
    })
    expect(heard).toEqual(woke.phases)
    expect(calls).toEqual([
      'POST /sleep?level=2',
      'POST /wake_up?tags=weights',
      'POST /collective_rpc {"method":"reload_weights"}',
      'POST /wake_up?tags=kv_cache',
      'GET /is_sleeping',
      'POST /reset_prefix_cache',
    ])
  })

  it('wakes level 2 by tags: the weights are reloaded with them, the cache reset once all is awake', async () => {
    const client = fresh()
    await client.sleep(2)
    calls.length = 0
    expect(await client.wakeUp(2, ['weights'])).toEqual({
      phases: ['weights', 'reload_weights'],
      sleeping: true,
    })
    expect(await client.wakeUp(2, ['kv_cache'], { done: ['weights', 'reload_weights'] })).toEqual({
      phases: ['kv_cache', 'reset_prefix_cache'],
      sleeping: false,
    })
    expect(calls).toEqual([
      'POST /wake_up?tags=weights',
      'POST /collective_rpc {"method":"reload_weights"}',
      'GET /is_sleeping',
      'POST /wake_up?tags=kv_cache',
      'GET /is_sleeping',
      'POST /reset_prefix_cache',
    ])
  })

  it('stops at a failing phase, naming it, and resumes after the phases that finished', async () => {
    const client = fresh()
    await client.sleep(2)
    calls.length = 0
    knobs.failReload = true
    const err = await client.wakeUp(2).then(
      () => null,
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(WakeError)
    const w = err as WakeError
    expect(w.phase).toBe('reload_weights')
    expect(w.done).toEqual(['weights'])
    expect(w.status).toBe(500)
    expect(w.message).toStartWith(
      'wake failed at reload_weights after weights: engine POST /collective_rpc answered 500',
    )
    expect(calls).toEqual(['POST /wake_up?tags=weights', 'POST /collective_rpc {"method":"reload_weights"}'])

    // The weights are awake already: the next wake does not wake them again, it reloads and goes on.
    knobs.failReload = false
    calls.length = 0
    expect(await client.wakeUp(2, [], { done: w.done })).toEqual({
      phases: ['reload_weights', 'kv_cache', 'reset_prefix_cache'],
      sleeping: false,
    })
    expect(calls[0]).toBe('POST /collective_rpc {"method":"reload_weights"}')

    // A prefix cache that will not reset fails the last phase: the engine is awake but not served.
    await client.sleep(2)
    knobs.resetSuccess = false
    const reset = (await client.wakeUp(2).catch((e: unknown) => e)) as WakeError
    expect(reset.phase).toBe('reset_prefix_cache')
    expect(reset.done).toEqual(['weights', 'reload_weights', 'kv_cache'])
  })

  it('reads the level an engine sleeps at from vllm:engine_sleep_state, null when it has none', async () => {
    const client = fresh()
    const gauge = (state: string) =>
      ['awake', 'weights_offloaded', 'discard_all']
        .map(
          (s) =>
            `vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="${s}"} ${s === state ? 1 : 0}`,
        )
        .join('\n')
    knobs.metrics = gauge('discard_all')
    expect(await client.sleepLevel()).toBe(2)
    knobs.metrics = gauge('weights_offloaded')
    expect(await client.sleepLevel()).toBe(1)
    knobs.metrics = gauge('awake')
    expect(await client.sleepLevel()).toBe(0)
    knobs.metrics = 'vllm:num_requests_running{engine="0"} 0\n'
    expect(await client.sleepLevel()).toBeNull()
  })

  it("reads the level from current builds' vllm:engine_sleep_component_state: the weights' state", async () => {
    const client = fresh()
    const gauge = (on: Record<string, string>) =>
      [
        ['scheduler', 'running'],
        ['scheduler', 'paused'],
        ['weights', 'resident'],
        ['weights', 'offloaded'],
        ['weights', 'discarded'],
        ['kv_cache', 'resident'],
        ['kv_cache', 'discarded'],
      ]
        .map(
          ([c, s]) =>
            `vllm:engine_sleep_component_state{component="${c}",engine="0",model_name="m",state="${s}"} ${on[c!] === s ? '1.0' : '0.0'}`,
        )
        .join('\n')
    knobs.metrics = gauge({ scheduler: 'paused', weights: 'offloaded', kv_cache: 'discarded' })
    expect(await client.sleepLevel()).toBe(1)
    expect(client.sleepGauge).toBe('component')
    knobs.metrics = gauge({ scheduler: 'paused', weights: 'discarded', kv_cache: 'discarded' })
    expect(await client.sleepLevel()).toBe(2)
    // A KV-only release (/release_kv_cache_memory) leaves the weights resident: not a sleep level.
    knobs.metrics = gauge({ scheduler: 'paused', weights: 'resident', kv_cache: 'discarded' })
    expect(await client.sleepLevel()).toBe(0)
    knobs.metrics = gauge({ scheduler: 'running', weights: 'resident', kv_cache: 'resident' })
    expect(await client.sleepLevel()).toBe(0)
    // Both gauges: the component gauge is the one read.
    knobs.metrics = `${gauge({ weights: 'offloaded' })}\nvllm:engine_sleep_state{engine="0",sleep_state="discard_all"} 1.0`
    expect(await client.sleepLevel()).toBe(1)
  })

  it('sends mode=keep after a drain only to a build with the component gauge', async () => {
    const current = fresh()
    knobs.metrics = 'vllm:engine_sleep_component_state{component="weights",state="resident"} 1.0\n'
    expect(await current.drainedSleepMode()).toBe('keep')
    const older = fresh()
    knobs.metrics = 'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 1.0\n'
    expect(await older.drainedSleepMode()).toBe('wait')
    expect(older.sleepGauge).toBe('state')
    const oldest = fresh()
    knobs.metrics = 'vllm:num_requests_running{engine="0"} 0\n'
    expect(await oldest.drainedSleepMode()).toBe('wait')
    expect(oldest.sleepGauge).toBe('none')
  })
})

describe('readSleepOperationSeconds', () => {
  it('means vllm:rl_sleep_mode_operation_duration_seconds per operation, null when it is absent', () => {
    const h = 'vllm:rl_sleep_mode_operation_duration_seconds'
    const text = [
      `# TYPE ${h} histogram`,
      `${h}_bucket{le="1.0",operation="sleep"} 2.0`,
      `${h}_count{operation="sleep"} 2.0`,
      `${h}_sum{operation="sleep"} 3.0`,
      `${h}_count{operation="wake"} 1.0`,
      `${h}_sum{operation="wake"} 0.5`,
      `${h}_count{operation="release_kv_cache_memory"} 0.0`,
      `${h}_sum{operation="release_kv_cache_memory"} 0.0`,
    ].join('\n')
    expect(readSleepOperationSeconds(text)).toEqual({ sleep: 1.5, wake: 0.5, release_kv_cache_memory: null })
    expect(readSleepOperationSeconds('vllm:num_requests_running{engine="0"} 0\n')).toBeNull()
  })
})

/** What each release's /metrics page says while asleep (test/fixtures/vllm-metrics, sources in its README). */
const METRIC_FIXTURES = join(import.meta.dir, '..', 'fixtures', 'vllm-metrics')
const METRIC_EXPECTED: Record<string, { level: 0 | 1 | 2 | null; gauge: string; seconds: unknown }> = {
  '0.11.0.prom': { level: null, gauge: 'none', seconds: null },
  '0.11.1.prom': { level: 1, gauge: 'state', seconds: null },
  '0.29.0.prom': { level: 2, gauge: 'state', seconds: null },
  '0.30.0.prom': {
    level: 1,
    gauge: 'component',
    seconds: { sleep: 2.5, wake: 3.5, release_kv_cache_memory: null },
  },
}

describe('real vLLM /metrics per sleep-gauge release (test/fixtures/vllm-metrics)', () => {
  it('has an expectation for every fixture file', () => {
    const files = readdirSync(METRIC_FIXTURES).filter((f) => f.endsWith('.prom'))
    expect(files.sort()).toEqual(Object.keys(METRIC_EXPECTED).sort())
  })
  for (const [file, want] of Object.entries(METRIC_EXPECTED))
    it(`${file}: level ${want.level} from the ${want.gauge} gauge`, () => {
      const text = readFileSync(join(METRIC_FIXTURES, file), 'utf8')
      expect(readSleepLevel(text)).toEqual({ level: want.level, gauge: want.gauge as 'none' })
      expect(readSleepOperationSeconds(text)).toEqual(want.seconds as null)
    })
})
