import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { PeerClient, PeerError } from '../../plugins/cluster/peer-client.ts'
import { checkClusterSecrets, InternalVerifier } from '../../plugins/cluster/signing.ts'
import { Logger } from '../../src/host/logger.ts'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { AppError } from '../../src/http/errors.ts'
import { startHost, type TestHost } from '../support/host.ts'

/**
 * PeerClient against a real listener that verifies the cluster signature (the test plugin installs
 * the verifier with the real clock): what one pod's control plane sees when it calls another.
 */
const SECRET = 'peer-client-cluster-secret-0123'

/** release ends the slow route's wait (it would otherwise hold the listener's shutdown). */
const slow = Promise.withResolvers<void>()

const peer = definePlugin({
  id: 'peer',
  description: 'internal routes a PeerClient calls',
  config: T.Object({}, { additionalProperties: false }),
  setup(ctx) {
    checkClusterSecrets(ctx.config.auth)
    ctx.auth.useInternalVerifier(
      new InternalVerifier({ podId: 'pod-c', secrets: [ctx.config.auth.cluster_secret!], rateLimit: 100 }),
    )
    return {
      routes: new Elysia()
        .post('/internal/echo', ({ body, headers, query }) => ({
          body,
          query,
          pod: headers['x-cluster-pod'],
          term: headers['x-cluster-term'],
        }))
        .post('/internal/command', () => {
          // What a pod answers a command under a term lower than one it has seen.
          throw new AppError(409, 'STALE_TERM', 'term 3 is older than term 7', 'conflict', undefined, {
            'x-cluster-term': '7',
          })
        })
        .get('/internal/slow', async () => {
          await slow.promise
          return { late: true }
        })
        .get('/internal/events', () => {
          const stream = new ReadableStream<Uint8Array>({
            start(c) {
              c.enqueue(new TextEncoder().encode('event: status\ndata: {"n":1}\n\n'))
            },
          })
          return new Response(stream, { headers: { 'content-type': 'text/event-stream' } })
        }),
    }
  },
}) as unknown as PluginDefinition

function client(timeoutMs = 10_000, secret = SECRET): PeerClient {
  return new PeerClient({
    secret,
    podId: 'pod-b',
    term: () => 3,
    timeoutMs,
    log: new Logger('error', 'test'),
  })
}

describe('PeerClient', () => {
  let th: TestHost
  /** podC: the listener, pod `pod-c`, as a call's destination. */
  const podC = () => ({ podId: 'pod-c', address: th.url })
  beforeAll(async () => {
    th = await startHost('plugins:\n  peer: {}\n', [peer], { CLUSTER_SECRET: SECRET })
  })
  afterAll(async () => {
    slow.resolve()
    await th.stop()
  })

  it('round-trips JSON, signed and addressed to the pod, with its pod and term', async () => {
    const c = client()
    const out = await c.request(podC(), 'POST', '/internal/echo?x=1', { hello: 'wörld' })
    expect(out).toEqual({ body: { hello: 'wörld' }, query: { x: '1', to: 'pod-c' }, pod: 'pod-b', term: '3' })
    // The same call twice in a row is two requests, not a replay.
    expect(await c.request(podC(), 'POST', '/internal/echo?x=1', { hello: 'wörld' })).toEqual(out)
  })

  it('is refused when signing with a secret the peer does not hold', async () => {
    const err = await client(10_000, 'some-other-secret-0123456789')
      .request(podC(), 'POST', '/internal/echo', {})
      .then(
        () => null,
        (e: unknown) => e,
      )
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({
      status: 401,
      code: 'UNAUTHORIZED',
      message: 'Invalid cluster signature',
      peer: th.url,
    })
  })

  it('is refused 403 WRONG_DESTINATION when the call is addressed to another pod', async () => {
    const err = await client()
      .request({ podId: 'pod-d', address: th.url }, 'POST', '/internal/echo', {})
      .then(
        () => null,
        (e: unknown) => e,
      )
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({
      status: 403,
      code: 'WRONG_DESTINATION',
      message: "Signed cluster request is for pod 'pod-d', not this pod ('pod-c')",
      peer: th.url,
    })
  })

  it('surfaces 409 STALE_TERM with the term the peer reported', async () => {
    const err = await client()
      .request(podC(), 'POST', '/internal/command', { op: 'unload' })
      .then(
        () => null,
        (e: unknown) => e,
      )
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({
      status: 409,
      code: 'STALE_TERM',
      message: 'term 3 is older than term 7',
      peerTerm: 7,
    })
  })

  it('gives up at its deadline with 504 naming the peer', async () => {
    const err = await client(200)
      .request(podC(), 'GET', '/internal/slow')
      .then(
        () => null,
        (e: unknown) => e,
      )
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({ status: 504, code: 'PEER_TIMEOUT', peer: th.url })
    expect((err as Error).message).toContain(th.url)
  })

  it('reports a closed port as 502 naming the peer', async () => {
    const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    const closed = `http://127.0.0.1:${probe.port}`
    probe.stop(true)
    const err = await client()
      .request({ podId: 'pod-c', address: closed }, 'GET', '/internal/ping')
      .then(
        () => null,
        (e: unknown) => e,
      )
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({ status: 502, code: 'PEER_UNAVAILABLE', peer: closed })
    expect((err as Error).message).toContain(closed)
  })

  it('opens a signed event stream and lets the caller end it', async () => {
    const stop = new AbortController()
    const res = await client().stream(podC(), '/internal/events', stop.signal)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const reader = res.body!.getReader()
    const first = await reader.read()
    expect(new TextDecoder().decode(first.value)).toBe('event: status\ndata: {"n":1}\n\n')
    stop.abort()
    await expect(reader.read()).rejects.toThrow()
  })
})
