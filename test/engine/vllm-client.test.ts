import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Server } from 'bun'
import { EngineCallError, engineOrigin, VllmClient, waitHealthy } from '../../src/engine/vllm-client.ts'
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
    const t0 = performance.now()
    const waiting = waitHealthy(new VllmClient(url), {
      initialMs: 5000,
      maxMs: 5000,
      deadlineMs: 60_000,
      signal: stop.signal,
    })
    expect(await waiting).toBe('stopped')
    expect(performance.now() - t0).toBeLessThan(2000)
    onHealth = () => {}
    expect(await waitHealthy(new VllmClient(url), { ...opts, stop: () => true })).toBe('stopped')
    healthStatus = 200
  })
})
