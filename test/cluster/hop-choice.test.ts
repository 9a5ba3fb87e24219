import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Registry } from 'prom-client'
import { ClusterHop, FAILED_POD_MS, withoutNonce } from '../../plugins/cluster/hop.ts'
import type { RoutingTable } from '../../plugins/cluster/schemas.ts'
import type { RemoteRequest } from '../../plugins/gateway/api.ts'
import { Logger } from '../../src/host/logger.ts'
import { BodyRange } from '../../src/wire/body-range.ts'
import type { ForwardEnd, WireAction, WireForwardAction } from '../../src/wire/route.ts'
import { freePort } from '../sim/helpers.ts'

/**
 * Which pod a hop goes to (plugins/cluster/hop.ts), on a routing table the test writes: the pods are
 * a real listener that accepts connections and a port nobody listens on. The hop itself, between
 * real pods, is test/cluster/hop.test.ts.
 */
const SECRET = 'cluster-hop-secret-for-tests-0123'

describe('cluster hop: which pod', () => {
  const quiet = new Logger('error', 'test', 'text', () => {})
  let clock = 1_000_000
  // A pod that accepts connections (the hop only needs to reach it here).
  const live = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  let dead = ''
  const entry = (podId: string, weight: number, address = `http://127.0.0.1:${live.port}`) => ({
    podId,
    podAddress: address,
    vllmPort: 1,
    weight,
  })
  const table: RoutingTable = { version: 1, term: 1, builtBy: 'x', entries: {} }
  const hop = new ClusterHop({
    cluster: { podId: 'self', fence: { term: 1 }, routingTable: () => table, pods: () => [] },
    inference: { useRemote: () => () => {}, planLocal: () => ({ json: {} }) },
    secret: SECRET,
    metrics: new Registry(),
    log: quiet,
    now: () => clock,
  })
  const ended: ForwardEnd[] = []
  const request = (model: string, runningOnly = false): RemoteRequest => ({
    model,
    path: '/v1/chat/completions',
    query: '?x=1',
    body: BodyRange.from(Buffer.from('{"model":"m"}')),
    runningOnly,
    connectTimeoutMs: 2000,
    firstByteTimeoutMs: 2000,
    record: (info) => ended.push(info),
  })
  /** forwardOf: the forward a plan comes to (waiting for its connect when it defers). */
  const forwardOf = async (action: WireAction | null): Promise<WireForwardAction> => {
    if (action && 'defer' in action) action = await action.defer(new AbortController().signal)
    if (!action || !('forward' in action)) throw new Error(`no forward: ${JSON.stringify(action)}`)
    return action.forward
  }
  const end: ForwardEnd = {
    status: 200,
    bytes: 1,
    durationMs: 1,
    ttftMs: null,
    streamed: false,
    aborted: false,
  }

  beforeAll(async () => {
    dead = `http://127.0.0.1:${await freePort()}`
  })
  afterAll(() => live.stop(true))

  it('puts running pods before sleeping ones, never itself, one entry per pod', () => {
    table.entries.m = [entry('p1', 0), entry('self', 1), entry('p2', 1), entry('p2', 0), entry('p3', 1)]
    expect(hop.candidates('m', false).map((e) => e.podId)).toEqual(['p2', 'p3', 'p1'])
    expect(hop.candidates('m', true).map((e) => e.podId)).toEqual(['p2', 'p3'])
    expect(hop.candidates('other', false)).toEqual([])
    expect(hop.plan(request('other'))).toBeNull()
  })

  it('prefers the pod with the fewest hops in flight, and signs a target with a nonce, then its destination, first', async () => {
    table.entries.m = [entry('p2', 1), entry('p3', 1)]
    const first = await forwardOf(hop.plan(request('m')))
    expect(first.target).toMatch(/^\/internal\/v1\/v1\/chat\/completions\?hop=[\w-]+\.\w+&to=p2&x=1$/)
    expect(withoutNonce(first.target.slice(first.target.indexOf('?')))).toBe('?x=1')
    // A client's own `to` is the client's: only the destination right after the nonce is removed.
    expect(withoutNonce('?hop=n.1&to=p2&to=mine')).toBe('?to=mine')
    expect(first.extraHead).toContain('x-cluster-pod: self\r\n')
    expect(hop.candidates('m', false).map((e) => e.podId)).toEqual(['p3', 'p2'])
    const second = await forwardOf(hop.plan(request('m')))
    expect(second.target).not.toBe(first.target)
    first.onEnd(end)
    second.onEnd(end)
    expect(hop.candidates('m', false).map((e) => e.podId)).toEqual(['p2', 'p3'])
    expect(ended.length).toBe(2)
  })

  it('skips a pod that failed to connect, and tries it last until FAILED_POD_MS have passed', async () => {
    table.entries.m = [entry('gone', 1, dead), entry('p2', 1)]
    const forward = await forwardOf(hop.plan(request('m')))
    expect(forward.origin).toBe(`http://127.0.0.1:${live.port}`)
    forward.onEnd(end)
    expect(hop.candidates('m', false).map((e) => e.podId)).toEqual(['p2', 'gone'])
    clock += FAILED_POD_MS
    expect(hop.candidates('m', false).map((e) => e.podId)).toEqual(['gone', 'p2'])
  })

  it('answers 502 upstream_unavailable when no pod can be reached', async () => {
    table.entries.m = [entry('gone', 1, dead)]
    const action = hop.plan(request('m'))
    const decided = action && 'defer' in action ? await action.defer(new AbortController().signal) : action
    expect(decided).toMatchObject({ error: { status: 502, code: 'upstream_unavailable' } })
    expect(ended.at(-1)).toMatchObject({ status: 502, error: 'upstream_unavailable' })
  })
})
