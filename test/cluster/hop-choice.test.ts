import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Registry } from 'prom-client'
import { ClusterHop, FAILED_POD_MS, withoutNonce } from '../../plugins/cluster/hop.ts'
import type { RoutingTable } from '../../plugins/cluster/schemas.ts'
import { GATEWAY_ANSWERS } from '../../plugins/gateway/proxy/answers.ts'
import type { Backend, BackendKind } from '../../src/directory/backend.ts'
import { type ListenerPlan, ModelDirectory, type ProxyRequestEvent } from '../../src/directory/directory.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import { BodyRange } from '../../src/wire/body-range.ts'
import type { ScannedJson } from '../../src/wire/json-scan.ts'
import type { ForwardEnd, WireAction, WireForwardAction } from '../../src/wire/route.ts'
import { freePort } from '../sim/helpers.ts'

/**
 * Which pod a hop goes to: the other pods are backends of the model directory (src/directory),
 * ordered with this pod's own there (order.ts), on a routing table the test writes: the pods are a
 * real listener that accepts connections and a port nobody listens on. The hop itself, between
 * real pods, is test/cluster/hop.test.ts.
 */
const SECRET = 'cluster-hop-secret-for-tests-0123'
const PODS: ReadonlySet<BackendKind> = new Set(['pod'])
const LOCAL_AND_PODS: ReadonlySet<BackendKind> = new Set(['instance', 'pod'])

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
  const bus = new EventBus()
  const directory = new ModelDirectory(bus, quiet, new Registry())
  const hop = new ClusterHop({
    cluster: { podId: 'self', fence: { term: 1 }, routingTable: () => table, pods: () => [] },
    inference: { planLocal: () => ({ json: {} }), useRemoteModels: () => () => {} },
    directory,
    secret: SECRET,
    metrics: new Registry(),
    log: quiet,
    now: () => clock,
  })
  hop.start()
  // A local instance of `m` that sleeps, when a test wants one beside the pods.
  let localAsleep = false
  const asleep = {
    kind: 'instance',
    key: 'local-1',
    model: 'm',
    local: true,
    readiness: () => 'asleep',
    inFlight: () => 0,
  } as Backend
  directory.addSource({ backends: (name) => (localAsleep && name === 'm' ? [asleep] : []) })
  const ended: ProxyRequestEvent[] = []
  bus.on('proxy.request', (e) => ended.push(e))
  const plan: ListenerPlan = { kinds: PODS, policy: 'reject', holdTimeoutMs: 1000, answers: GATEWAY_ANSWERS }
  const request = (model: string): WireAction =>
    directory.plan(
      model,
      {
        path: '/v1/chat/completions',
        enginePath: '/v1/chat/completions',
        query: '?x=1',
        body: BodyRange.from(Buffer.from('{"model":"m"}')),
        json: {} as ScannedJson,
        startedAt: performance.now(),
        connectTimeoutMs: 2000,
        firstByteTimeoutMs: 2000,
      },
      plan,
    )
  const order = (model: string, kinds = PODS) =>
    directory.candidates(model, kinds).map((b) => b.podId ?? b.key)
  /** forwardOf: the forward a plan comes to (waiting for its connect when it defers). */
  const forwardOf = async (action: WireAction | null): Promise<WireForwardAction> => {
    while (action && 'defer' in action) action = await action.defer(new AbortController().signal)
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
    expect(order('m')).toEqual(['p2', 'p3', 'p1'])
    // With an instance of the model here, another pod is worth a hop only where the model runs.
    localAsleep = true
    expect(order('m', LOCAL_AND_PODS)).toEqual(['p2', 'p3', 'local-1'])
    localAsleep = false
    expect(order('other')).toEqual([])
    expect(request('other')).toMatchObject({ error: { status: 400, code: 'invalid_model' } })
  })

  it('prefers the pod with the fewest hops in flight, and signs a target with a nonce, then its destination, first', async () => {
    table.entries.m = [entry('p2', 1), entry('p3', 1)]
    const first = await forwardOf(request('m'))
    expect(first.target).toMatch(/^\/internal\/v1\/v1\/chat\/completions\?hop=[\w-]+\.\w+&to=p2&x=1$/)
    expect(withoutNonce(first.target.slice(first.target.indexOf('?')))).toBe('?x=1')
    // A client's own `to` is the client's: only the destination right after the nonce is removed.
    expect(withoutNonce('?hop=n.1&to=p2&to=mine')).toBe('?to=mine')
    expect(first.extraHead).toContain('x-cluster-pod: self\r\n')
    expect(order('m')).toEqual(['p3', 'p2'])
    const second = await forwardOf(request('m'))
    expect(second.target).not.toBe(first.target)
    first.onEnd(end)
    second.onEnd(end)
    expect(order('m')).toEqual(['p2', 'p3'])
    expect(ended.length).toBe(2)
  })

  it('skips a pod that failed to connect, and tries it last until FAILED_POD_MS have passed', async () => {
    table.entries.m = [entry('gone', 1, dead), entry('p2', 1)]
    const forward = await forwardOf(request('m'))
    expect(forward.origin).toBe(`http://127.0.0.1:${live.port}`)
    forward.onEnd(end)
    expect(order('m')).toEqual(['p2', 'gone'])
    clock += FAILED_POD_MS
    expect(order('m')).toEqual(['gone', 'p2'])
  })

  it('answers 502 upstream_unavailable when no pod can be reached', async () => {
    table.entries.m = [entry('gone', 1, dead)]
    let action = request('m')
    while ('defer' in action) action = await action.defer(new AbortController().signal)
    expect(action).toMatchObject({ error: { status: 502, code: 'upstream_unavailable' } })
    expect(ended.at(-1)).toMatchObject({ status: 502, error: 'upstream_unavailable' })
  })
})
