import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { GATEWAY_ANSWERS } from '../../plugins/gateway/proxy/answers.ts'
import type {
  Backend,
  BackendKind,
  BackendRequest,
  LeaseHandle,
  Readiness,
} from '../../src/directory/backend.ts'
import {
  type ListenerPlan,
  MAX_HOLDS,
  type ModelDirectory,
  type ProxyRequestEvent,
} from '../../src/directory/directory.ts'
import { WAKE_RETRY_MS } from '../../src/directory/wake.ts'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import type { InferenceGrant, WireAction } from '../../src/wire/route.ts'
import { freePort } from '../sim/helpers.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { NetRaw, parse } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'
import { type Stub, sseResponse, startStub, streamFrames } from '../wire/support.ts'

/**
 * The model directory (src/directory) through a real listener: a plugin whose one hot route plans
 * every request through the host's directory, with test backends (a scriptable readiness, a wake
 * the test settles, leases counted) in front of a real engine stub. Clients are raw sockets.
 */
const KINDS: ReadonlySet<BackendKind> = new Set(['instance'])

class TestBackend implements Backend {
  readonly kind = 'instance'
  readonly local = true
  state: Readiness = 'ready'
  open = 0
  wakes = 0
  /** The wake under way, which the test settles (wakeDone/wakeFails). */
  private pending: PromiseWithResolvers<void> | null = null
  hint: number | null = null
  /** A bounded queue for its requests while it wakes (null: none, the listener's policy applies). */
  queueMax: number | null = null
  /** The queries of the requests forwarded to it, in the order they were forwarded. */
  readonly forwarded: string[] = []
  /** An engine that stopped after the plan: its port refuses the connection (set: that port). */
  refusedPort: number | null = null

  constructor(
    readonly key: string,
    readonly model: string,
    private readonly stub: () => Stub,
  ) {}

  get instanceId(): string {
    return this.key
  }

  readiness(): Readiness {
    return this.state
  }

  inFlight(): number {
    return this.open
  }

  acquire(): void {
    this.open++
  }

  release(): void {
    this.open--
  }

  retryAfterSeconds(): number | null {
    return this.hint
  }

  queue(): { max: number; timeoutMs: number } | null {
    return this.queueMax === null ? null : { max: this.queueMax, timeoutMs: 5000 }
  }

  /** wake: one per backend, joined by every caller while it runs. */
  wake(): Promise<void> {
    if (!this.pending) {
      this.wakes++
      this.state = 'waking'
      this.pending = Promise.withResolvers<void>()
    }
    return this.pending.promise
  }

  wakeDone(): void {
    this.state = 'ready'
    this.pending?.resolve()
    this.pending = null
  }

  /** wakeEndsEvicted: the wake ends, and the model is put to sleep again before anyone's turn (an eviction). */
  wakeEndsEvicted(): void {
    this.state = 'asleep'
    this.pending?.resolve()
    this.pending = null
  }

  wakeFails(message: string): void {
    this.state = 'asleep'
    this.pending?.reject(new Error(message))
    this.pending = null
  }

  forward(req: BackendRequest, lease: LeaseHandle): WireAction {
    this.forwarded.push(req.query)
    return {
      forward: {
        origin: this.refusedPort === null ? this.stub().url : `http://127.0.0.1:${this.refusedPort}`,
        retry: lease,
        target: req.enginePath + req.query,
        body: req.body,
        firstByteTimeoutMs: 5000,
        connectTimeoutMs: 1000,
        onEnd: lease.end,
      },
    }
  }
}

let stub: Stub
let th: TestHost
let directory: ModelDirectory
let port = 0
const backends = new Map<string, TestBackend>()
const ended: ProxyRequestEvent[] = []
let policy: 'reject' | 'hold' = 'reject'

const add = (key: string, model: string) => {
  const b = new TestBackend(key, model, () => stub)
  backends.set(key, b)
  return b
}

beforeAll(async () => {
  stub = startStub((_req, seen) =>
    seen.path === '/v1/stream'
      ? sseResponse(streamFrames(200), 20)
      : Response.json({ ok: true }, { headers: { 'content-type': 'application/json' } }),
  )
  const plugin = definePlugin({
    id: 'gateway',
    description: 'the directory under test',
    config: T.Object({}, { additionalProperties: true }),
    setup(ctx) {
      directory = ctx.directory
      ctx.directory.addSource({
        backends: (name) => [...backends.values()].filter((b) => b.model === name),
      })
      const plan = (): ListenerPlan => ({
        kinds: KINDS,
        policy,
        holdTimeoutMs: 5000,
        answers: GATEWAY_ANSWERS,
      })
      return {
        rawRoutes: [
          {
            match: (path, method) => method === 'POST' && path.startsWith('/v1/'),
            wire: (req) => {
              const json = req.json()
              if (typeof json === 'string') return { error: GATEWAY_ANSWERS.unknown('?') }
              return ctx.directory.plan(
                json.string('model') ?? '',
                {
                  path: req.path,
                  enginePath: req.path,
                  query: req.query,
                  body: req.body,
                  json,
                  startedAt: req.startedAt,
                  firstByteTimeoutMs: 5000,
                  connectTimeoutMs: 1000,
                  grant: grantOf(req.header('x-priority')),
                },
                plan(),
              )
            },
          },
        ],
      }
    },
  }) as unknown as PluginDefinition
  // Warnings are kept (th.logs): a failed wake's one line is read.
  th = await startHost('plugins:\n  gateway: {}\n', [plugin], {}, undefined, { logLevel: 'warn' })
  port = Number(new URL(th.url).port)
  th.host.bus.on('proxy.request', (e) => ended.push(e))
})

afterAll(async () => {
  await th?.stop()
  stub?.stop()
})

/**
 * grantOf: a request's grant as an inference key would give it, with the priority the test names in
 * `x-priority` (0 high, 1 normal, 2 low); none without it. Its ends are counted in `grantEnds`.
 */
const grantEnds: number[] = []
function grantOf(priority: string | null): InferenceGrant | null {
  if (priority === null) return null
  return {
    responseHead: '',
    priority: Number(priority),
    metered: false,
    begin: () => null,
    allows: () => null,
    lists: () => true,
    end: (status) => {
      grantEnds.push(status)
    },
  }
}

/** send: one request for `model` on a raw socket (the reply is read on the returned connection). */
async function send(model: string, path = '/v1/chat', priority?: number): Promise<NetRaw> {
  const body = JSON.stringify({ model })
  const c = await NetRaw.open(port)
  const extra = priority === undefined ? '' : `x-priority: ${priority}\r\n`
  c.write(`POST ${path} HTTP/1.1\r\nHost: a\r\n${extra}Content-Length: ${body.length}\r\n\r\n${body}`)
  return c
}

async function answer(
  model: string,
): Promise<{ status: number; headers: Record<string, string>; body: string }> {
  const c = await send(model)
  await c.waitFor((r) => parse(r.text).length === 1, 5000, 'an answer')
  c.socket.destroy()
  return parse(c.text)[0]!
}

describe('the model directory: refusals say what they are', () => {
  it('unknown: no backend has the name', async () => {
    const res = await answer('nobody')
    expect(res.status).toBe(400)
    expect(JSON.parse(res.body).error.code).toBe('invalid_model')
  })

  it('starting: loading, with the Retry-After the backend estimates', async () => {
    const b = add('s1', 'loading-model')
    b.state = 'starting'
    b.hint = 42
    const res = await answer('loading-model')
    expect(res.status).toBe(503)
    expect(res.headers['retry-after']).toBe('42')
    expect(JSON.parse(res.body).error.code).toBe('model_not_ready')
  })

  it('unavailable: it exists but cannot serve', async () => {
    add('u1', 'broken-model').state = 'unavailable'
    const res = await answer('broken-model')
    expect(res.status).toBe(503)
    expect(JSON.parse(res.body).error.message).toContain('is not ready')
  })

  it('waking (reject): the wake starts once however many requests ask, and a failure is refused for a while', async () => {
    const b = add('z1', 'sleepy-model')
    b.state = 'asleep'
    b.hint = 7
    const [r1, r2] = await Promise.all([answer('sleepy-model'), answer('sleepy-model')])
    for (const r of [r1, r2]) {
      expect(r.status).toBe(503)
      expect(r.headers['retry-after']).toBe('7')
      expect(JSON.parse(r.body).error.code).toBe('model_sleeping')
    }
    expect(b.wakes).toBe(1)
    b.wakeFails('the engine said no')
    await waitFor('the failure to be recorded', () =>
      directory.record('sleepy-model').recentFailure(performance.now()),
    )
    const refused = await answer('sleepy-model')
    expect(refused.status).toBe(502)
    expect(JSON.parse(refused.body).error).toMatchObject({ code: 'wake_failed' })
    expect(JSON.parse(refused.body).error.message).toContain('the engine said no')
    // No second wake while the failure is fresh (WAKE_RETRY_MS).
    expect(b.wakes).toBe(1)
    expect(WAKE_RETRY_MS).toBeGreaterThan(1000)
  })
})

describe('the model directory: a failed wake', () => {
  it('is logged once, with the number of requests it failed, however many waited for it', async () => {
    policy = 'hold'
    try {
      const b = add('f1', 'failing-model')
      b.state = 'asleep'
      const conns: NetRaw[] = []
      for (let i = 0; i < 5; i++) {
        conns.push(await send('failing-model'))
        await waitFor(`request ${i} held`, () => directory.held('failing-model') === conns.length)
      }
      b.wakeFails('out of memory')
      for (const c of conns) {
        await c.waitFor((r) => parse(r.text).length === 1, 5000, 'an answer')
        expect(parse(c.text)[0]!.status).toBe(502)
        c.socket.destroy()
      }
      expect(b.wakes).toBe(1)
      const lines = th.logs.filter((l) => l.includes('wake on request failed') && l.includes('failing-model'))
      expect(lines).toHaveLength(1)
      expect(lines[0]).toContain('requests=5')
      expect(lines[0]).toContain('out of memory')
    } finally {
      policy = 'reject'
    }
  })
})

describe('the model directory: priorities of held requests', () => {
  it('held requests go on in priority order once their model serves, then in arrival order', async () => {
    policy = 'hold'
    try {
      const b = add('p1', 'priority-model')
      b.state = 'asleep'
      const order = [
        ['low-1', 2],
        ['normal', 1],
        ['low-2', 2],
        ['high', 0],
      ] as const
      const conns: NetRaw[] = []
      for (const [name, priority] of order) {
        conns.push(await send('priority-model', `/v1/chat?${name}`, priority))
        await waitFor(`${name} held`, () => directory.held('priority-model') === conns.length)
      }
      b.wakeDone()
      for (const c of conns) await c.waitFor((r) => parse(r.text).length === 1, 5000, 'an answer')
      expect(b.forwarded).toEqual(['?high', '?normal', '?low-1', '?low-2'])
      for (const c of conns) {
        expect(parse(c.text)[0]!.status).toBe(200)
        c.socket.destroy()
      }
    } finally {
      policy = 'reject'
    }
  })

  it('a full queue: a higher priority takes the place of the newest lowest (429 queue_full), an equal one is refused', async () => {
    const b = add('p2', 'queued-model')
    b.state = 'asleep'
    b.queueMax = 2
    const ends = grantEnds.length
    const low1 = await send('queued-model', '/v1/chat?low-1', 2)
    await waitFor('low-1 queued', () => directory.held('queued-model') === 1)
    const low2 = await send('queued-model', '/v1/chat?low-2', 2)
    await waitFor('low-2 queued', () => directory.held('queued-model') === 2)
    // Full: another low request is refused at once, without a place.
    const low3 = await send('queued-model', '/v1/chat?low-3', 2)
    await low3.waitFor((r) => parse(r.text).length === 1, 5000, 'the refusal of low-3')
    expect(parse(low3.text)[0]!.status).toBe(429)
    // A normal one displaces the newest low one, which is answered 429 queue_full at once.
    const normal = await send('queued-model', '/v1/chat?normal', 1)
    await low2.waitFor((r) => parse(r.text).length === 1, 5000, 'low-2 displaced')
    const displaced = parse(low2.text)[0]!
    expect(displaced.status).toBe(429)
    expect(JSON.parse(displaced.body).error.code).toBe('queue_full')
    expect(directory.held('queued-model')).toBe(2)
    b.wakeDone()
    for (const c of [normal, low1]) await c.waitFor((r) => parse(r.text).length === 1, 5000, 'an answer')
    expect(b.forwarded).toEqual(['?normal', '?low-1'])
    // Every grant was told its end once: two refused, two served.
    await waitFor('every grant ended', () => grantEnds.length === ends + 4)
    expect(grantEnds.slice(ends).sort()).toEqual([200, 200, 429, 429])
    for (const c of [low1, low2, low3, normal]) c.socket.destroy()
  })
})

describe('the model directory: leases', () => {
  it('orders serving before sleeping and the fewest in flight first', async () => {
    const busy = add('o1', 'pair-model')
    const idle = add('o2', 'pair-model')
    const asleep = add('o3', 'pair-model')
    asleep.state = 'asleep'
    busy.open = 3
    expect(directory.candidates('pair-model', KINDS).map((b) => b.key)).toEqual(['o2', 'o1', 'o3'])
    const res = await answer('pair-model')
    expect(res.status).toBe(200)
    expect(ended.at(-1)).toMatchObject({ model: 'pair-model', instance_id: 'o2', status: 200 })
    expect(idle.open).toBe(0)
    busy.open = 0
  })

  it('releases the lease when the client goes away mid-stream', async () => {
    const b = add('a1', 'stream-model')
    const c = await send('stream-model', '/v1/stream')
    await c.waitFor((r) => r.text.includes('data:'), 5000, 'the first frames')
    expect(b.open).toBe(1)
    c.socket.destroy()
    await waitFor('the lease released', () => b.open === 0)
    await waitFor('the end recorded as 499', () =>
      ended.some((e) => e.instance_id === 'a1' && e.status === 499),
    )
  })

  it('releases the lease when the engine dies mid-response', async () => {
    const b = add('d1', 'dying-model')
    const engine = Bun.listen({
      hostname: '127.0.0.1',
      port: 0,
      socket: {
        data(s) {
          s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n')
          s.write('6\r\ndata: \r\n')
          s.end()
        },
      },
    })
    const real = stub
    stub = { ...real, url: `http://127.0.0.1:${engine.port}` }
    try {
      const c = await send('dying-model', '/v1/stream')
      await c.waitFor((r) => r.text.endsWith('0\r\n\r\n'), 5000, 'the response to end')
      expect(c.text).toContain('upstream_disconnected')
      c.socket.destroy()
      await waitFor('the lease released', () => b.open === 0)
      expect(ended.find((e) => e.instance_id === 'd1')?.status).toBeGreaterThanOrEqual(500)
    } finally {
      stub = real
      engine.stop(true)
    }
  })

  it('a held request waits for the wake and is served the moment it ends; one explicit wake joins it', async () => {
    policy = 'hold'
    try {
      const b = add('h1', 'held-model')
      b.state = 'asleep'
      const c = await send('held-model')
      await waitFor('the request held', () => directory.held('held-model') === 1)
      // An operator's wake while the request's runs joins it: still one wake.
      const explicit = directory.wake(b)
      expect(b.wakes).toBe(1)
      expect(c.text).toBe('')
      b.wakeDone()
      await explicit
      await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the answer after the wake')
      expect(parse(c.text)[0]!.status).toBe(200)
      expect(directory.held('held-model')).toBe(0)
      expect(b.open).toBe(0)
      c.socket.destroy()
    } finally {
      policy = 'reject'
    }
  })

  it('a held request whose model is evicted again before its turn waits again, at most MAX_HOLDS times', async () => {
    policy = 'hold'
    try {
      const b = add('e1', 'evicted-model')
      b.state = 'asleep'
      const c = await send('evicted-model')
      await waitFor('the request held', () => b.wakes === 1 && directory.held('evicted-model') === 1)
      // Woken, then evicted at once: the request is held again for a second wake, not refused.
      b.wakeEndsEvicted()
      await waitFor('held again', () => b.wakes === 2 && directory.held('evicted-model') === 1)
      expect(c.text).toBe('')
      b.wakeDone()
      await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the answer after the second wake')
      expect(parse(c.text)[0]!.status).toBe(200)
      expect(b.open).toBe(0)
      c.socket.destroy()

      // Evicted after every wake: refused after its MAX_HOLDS-th wait, with Retry-After.
      b.state = 'asleep'
      const d = await send('evicted-model')
      for (let wake = 1; wake <= MAX_HOLDS; wake++) {
        await waitFor(`wait ${wake}`, () => b.wakes === 2 + wake && directory.held('evicted-model') === 1)
        b.wakeEndsEvicted()
      }
      await d.waitFor((r) => parse(r.text).length === 1, 5000, 'the refusal')
      const refused = parse(d.text)[0]!
      expect([refused.status, JSON.parse(refused.body).error.code]).toEqual([503, 'model_sleeping'])
      expect(refused.headers['retry-after']).toBeDefined()
      expect(b.wakes).toBe(2 + MAX_HOLDS)
      expect(directory.held('evicted-model')).toBe(0)
      d.socket.destroy()
    } finally {
      policy = 'reject'
    }
  })

  it('a request whose engine refuses the connection (stopped after the plan) goes to the next backend', async () => {
    const gone = add('r1', 'refused-model')
    gone.refusedPort = await freePort()
    const other = add('r2', 'refused-model')
    const c = await send('refused-model', '/v1/chat?first')
    await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the answer')
    // Planned to the stopped one first (the directory's order), served by the other.
    expect(parse(c.text)[0]!.status).toBe(200)
    expect([gone.forwarded, other.forwarded]).toEqual([['?first'], ['?first']])
    expect([gone.open, other.open]).toEqual([0, 0])
    c.socket.destroy()
    // With no other backend left, the refusal is answered 502, once, holding nothing.
    other.refusedPort = await freePort()
    const d = await send('refused-model', '/v1/chat?second')
    await d.waitFor((r) => parse(r.text).length === 1, 5000, 'the refusal')
    const refused = parse(d.text)[0]!
    expect([refused.status, JSON.parse(refused.body).error.code]).toEqual([502, 'upstream_unavailable'])
    expect([gone.open, other.open]).toEqual([0, 0])
    d.socket.destroy()
  })

  it('a client that leaves while held is counted gone and holds nothing', async () => {
    policy = 'hold'
    try {
      const b = add('g1', 'left-model')
      b.state = 'asleep'
      const c = await send('left-model')
      await waitFor('the request held', () => directory.held('left-model') === 1)
      c.socket.destroy()
      await waitFor('the hold released', () => directory.held('left-model') === 0)
      expect(b.open).toBe(0)
      b.wakeDone()
    } finally {
      policy = 'reject'
    }
  })

  it('on shutdown a held request is answered 503 at once, holding nothing', async () => {
    policy = 'hold'
    const b = add('x1', 'stopping-model')
    b.state = 'asleep'
    const c = await send('stopping-model')
    await waitFor('the request held', () => directory.held('stopping-model') === 1)
    directory.stop()
    await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the 503')
    const res = parse(c.text)[0]!
    expect(res.status).toBe(503)
    expect(JSON.parse(res.body).error.message).toContain('stopping')
    expect(directory.held('stopping-model')).toBe(0)
    expect(b.open).toBe(0)
    c.socket.destroy()
  })
})
