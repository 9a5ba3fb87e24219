import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import {
  errorOf,
  FakeGateway,
  instance,
  type ProxyHost,
  postJson,
  readChunks,
  type Stub,
  startProxyHost,
  startStub,
} from './support.ts'

/**
 * An engine stopped between a request's plan and its connect (a move's source unloaded by a forced
 * cancel, an unload) refuses the connection while the directory still reads its instance as
 * serving. Through the gateway's own /v1 and its instance backends (not a test backend), such a
 * request goes to the model's next instance and is answered 200 there, never 502; only when no
 * instance is left is it 502 `upstream_unavailable`, once. Every lease taken is given back.
 */
describe('a request planned to an engine that stopped before its connect', () => {
  const api = new FakeGateway()
  let stub: Stub
  let px: ProxyHost
  let closedPort: number

  beforeAll(async () => {
    stub = startStub()
    const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    closedPort = probe.port
    probe.stop(true)
    // The move's source (its engine already gone) and its target, one served name; the source is
    // listed first, so with nothing in flight the directory plans to it first.
    api.add(instance('source', closedPort, { served_model_name: 'moving' }))
    api.add(instance('target', stub.port, { served_model_name: 'moving' }))
    api.add(instance('alone', closedPort, { served_model_name: 'alone' }))
    px = await startProxyHost(api)
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  const chat = (body: Record<string, unknown>) =>
    postJson(`${px.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], ...body })
  const planned = () => px.host.directory.candidates('moving', new Set(['instance'])).map((b) => b.instanceId)

  it('is planned to the stopped source first', () => {
    expect(planned()).toEqual(['source', 'target'])
  })

  it('is served 200 by the next instance, plain and streamed, every lease given back', async () => {
    const before = stub.seen.length
    const plain = await chat({ model: 'moving' })
    expect(plain.status).toBe(200)
    expect(((await plain.json()) as { choices: unknown[] }).choices).toHaveLength(1)
    const streamed = await chat({ model: 'moving', stream: true })
    expect(streamed.status).toBe(200)
    const { chunks } = await readChunks(streamed)
    expect(chunks.join('').trimEnd().endsWith('data: [DONE]')).toBe(true)
    // Both reached the target's engine, once each.
    expect(stub.seen.length - before).toBe(2)
    expect([api.inFlight('source'), api.inFlight('target')]).toEqual([0, 0])
    expect(api.acquired).toBe(api.released)
    // The request's one end is the target's, answered 200.
    const ends = px.events.filter((e) => e.model === 'moving')
    expect(ends.map((e) => [e.instance_id, e.status])).toEqual([
      ['target', 200],
      ['target', 200],
    ])
  })

  it('with no instance left it is 502 upstream_unavailable, once, holding nothing', async () => {
    const res = await chat({ model: 'alone' })
    expect(res.status).toBe(502)
    expect((await errorOf(res)).code).toBe('upstream_unavailable')
    expect(api.inFlight('alone')).toBe(0)
    expect(api.acquired).toBe(api.released)
    expect(px.events.filter((e) => e.model === 'alone').map((e) => e.status)).toEqual([502])
  })
})
