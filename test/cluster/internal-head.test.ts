import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { addressedTo } from '../../plugins/cluster/signing.ts'
import { freePort } from '../sim/helpers.ts'
import { type EtcdPods, startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { NetRaw, parse, type Res } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The internal API's head stage: what cannot be a peer's request is refused from its head, before
 * a byte of its body is read or hashed, and what the head cannot tell (a member's id, from its
 * address, with a fake signature) is bounded while it is read and counted once it fails. Two pods
 * (a, b) in one test process led through a real etcd, auth on (simple mode, inference key, cluster
 * secret); every request goes through a real socket to a pod's listener. The fake signature is
 * well formed (64 hex digits) and the timestamp fresh, so only what the head checks refuses it.
 */
const SECRET = 'internal-head-secret-for-tests-0123'
const KEY = 'internal-head-inference-key'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  INFERENCE_API_KEY: KEY,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: 'internal-head-admin-password',
  JWT_SECRET: 'jwt-secret-for-the-internal-head-tests-0123456789',
}
const IDS = ['a', 'b'] as const
type PodId = (typeof IDS)[number]
const HOP = '/internal/v1/v1/chat/completions'
const FAKE_SIGNATURE = 'ab'.repeat(32)
/** The front's bound on internal bodies read before their signature is checked (FrontLimits). */
const MAX_UNVERIFIED = 16
/** plugins.cluster.internal_rate_limit (its default). */
const RATE = 100
const MB = 1024 * 1024

interface FakeHead {
  pod?: string | null
  to: string
  length: number
  ts?: number
  path?: string
}

/** fakeHead: a hop's head with a well-formed fake signature, naming `pod` and addressed `to`. */
function fakeHead(h: FakeHead): string {
  const pod = h.pod === undefined ? 'a' : h.pod
  return (
    `POST ${addressedTo(h.path ?? `${HOP}?hop=fake.1`, h.to)} HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
    `content-type: application/json\r\ncontent-length: ${h.length}\r\n` +
    `x-cluster-signature: ${FAKE_SIGNATURE}\r\nx-cluster-timestamp: ${h.ts ?? Date.now()}\r\n` +
    `${pod === null ? '' : `x-cluster-pod: ${pod}\r\n`}x-cluster-term: 1\r\n\r\n`
  )
}

/** answered: the connection's first complete response, waited for (the body, if any, was never sent). */
async function answered(c: NetRaw, what: string): Promise<Res & { code: string; message: string }> {
  await c.waitFor((r) => parse(r.text).length > 0, 15_000, what)
  const res = parse(c.text)[0]!
  const error = (JSON.parse(res.body) as { error: { code: string; message: string } }).error
  return { ...res, code: error.code, message: error.message }
}

/** headOnly: `head` alone on a new connection (from `localAddress`), and the answer it gets. */
async function headOnly(port: number, head: string, localAddress?: string) {
  const c = await NetRaw.open(port, localAddress)
  try {
    c.write(head)
    return await answered(c, 'an answer to the head alone')
  } finally {
    c.socket.destroy()
  }
}

const skip = !etcdAvailable()

describe.skipIf(skip)('the internal API from the head, on two pods led through etcd', () => {
  let etcd: TestEtcd
  let cluster: EtcdPods<PodId>
  const pods = {} as Record<PodId, TestGateway>
  const port = (id: PodId) => Number(new URL(pods[id].url).port)
  const front = (id: PodId) => pods[id].host.fronts.main!

  beforeAll(async () => {
    etcd = await startEtcd()
    cluster = await startEtcdPods({
      ids: IDS,
      etcd,
      clusterId: 'internal-head',
      enginePortBase: 27200,
      hostEnv: AUTH,
      // Room for every unverified body the front may read at once: what bounds them here is that limit.
      server: { max_buffered_body_bytes: 2048 * MB },
    })
    Object.assign(pods, cluster.pods)
  }, 90_000)

  afterAll(async () => {
    await cluster?.stop()
    await etcd?.stop()
  })

  it('refuses a 120 MB body naming an unknown pod from its head, never reading it', async () => {
    const res = await headOnly(port('b'), fakeHead({ pod: 'mallory', to: 'b', length: 120 * MB }))
    expect(res.status).toBe(403)
    expect(res.code).toBe('UNKNOWN_POD')
    expect(res.message).toBe("Pod 'mallory' is not a member of this cluster")
    // And one naming no pod at all.
    const none = await headOnly(port('b'), fakeHead({ pod: null, to: 'b', length: 120 * MB }))
    expect(none.status).toBe(401)
    expect(none.message).toBe('Missing X-Cluster-Pod header')
    expect(front('b').bufferedBodyBytes).toBe(0)
  })

  it("refuses a real pod's id from an address that is not that pod's, from its head", async () => {
    const res = await headOnly(port('b'), fakeHead({ to: 'b', length: 120 * MB }), '127.0.0.2')
    expect(res.status).toBe(403)
    expect(res.code).toBe('WRONG_SOURCE_ADDRESS')
    expect(res.message).toBe("Pod 'a' is at '127.0.0.1'; this request comes from 127.0.0.2")
  })

  it('refuses a stale timestamp and another pod as destination from the head', async () => {
    const stale = await headOnly(port('b'), fakeHead({ to: 'b', length: 120 * MB, ts: Date.now() - 31_000 }))
    expect(stale.status).toBe(401)
    expect(stale.message).toBe('X-Cluster-Timestamp is more than 30 s old')
    const elsewhere = await headOnly(port('b'), fakeHead({ to: 'a', length: 120 * MB }))
    expect(elsewhere.status).toBe(403)
    expect(elsewhere.code).toBe('WRONG_DESTINATION')
  })

  it(`reads at most ${MAX_UNVERIFIED} unverified bodies at once: the rest get 503 and health still answers`, async () => {
    const body = Buffer.alloc(50 * MB, 0x20)
    const conns = await Promise.all(Array.from({ length: 20 }, () => NetRaw.open(port('b'))))
    try {
      for (const c of conns) c.write(fakeHead({ to: 'b', length: body.length }))
      const refused = await waitFor(
        `${20 - MAX_UNVERIFIED} of 20 heads refused while ${MAX_UNVERIFIED} wait for their bodies`,
        () => {
          const done = conns.filter((c) => parse(c.text).length > 0)
          return done.length === 20 - MAX_UNVERIFIED && front('b').unverifiedInternal === MAX_UNVERIFIED
            ? done
            : undefined
        },
        { timeoutMs: 15_000, wake: (notify) => wakeOn(conns, notify) },
      )
      for (const c of refused) {
        const res = await answered(c, 'a 503')
        expect(res.status).toBe(503)
        expect(res.code).toBe('SERVICE_UNAVAILABLE')
        expect(res.message).toBe('Too many internal requests being verified; retry later')
        expect(res.headers['retry-after']).toBe('1')
      }
      const reading = conns.filter((c) => !refused.includes(c))
      // The pod answers its health probe while it holds them.
      const health = await fetch(`${pods.b.url}/api/health`, { signal: AbortSignal.timeout(5000) })
      expect(health.status).toBe(200)
      // Whole, each body is hashed and refused as unsigned; the count of bodies read goes back to 0.
      for (const c of reading) c.write(body)
      for (const c of reading) {
        const res = await answered(c, 'a 401 once the body is in')
        expect(res.status).toBe(401)
        expect(res.message).toBe('Invalid cluster signature')
      }
      expect(front('b').unverifiedInternal).toBe(0)
    } finally {
      for (const c of conns) c.socket.destroy()
    }
  }, 60_000)

  it(`answers 429 from the head once ${RATE} requests from one address failed in a second, and real hops still work`, async () => {
    // Pod a has seen no failure from this address: the 100 fake hops, pipelined on one connection,
    // are read and refused one by one; the 101st is refused from its head (its body is never sent).
    const fake = Buffer.from(`${fakeHead({ pod: 'b', to: 'a', length: 2 })}{}`, 'latin1')
    const c = await NetRaw.open(port('a'))
    try {
      c.write(Buffer.concat(Array.from({ length: RATE }, () => fake)))
      c.write(fakeHead({ pod: 'b', to: 'a', length: 120 * MB }))
      await c.waitFor((r) => parse(r.text).length === RATE + 1, 30_000, `${RATE + 1} answers`)
      const answers = parse(c.text)
      expect(answers.slice(0, RATE).map((r) => r.status)).toEqual(Array(RATE).fill(401))
      const last = answers[RATE]!
      expect(last.status).toBe(429)
      expect(last.headers['retry-after']).toBeDefined()
      const error = (JSON.parse(last.body) as { error: { code: string; message: string } }).error
      expect(error.code).toBe('RATE_LIMITED')
      expect(error.message).toBe(
        `More than ${RATE} internal requests from this address failed verification in the last second`,
      )
    } finally {
      c.socket.destroy()
    }
    // Real hops between the pods (from this same address) go on once the second is over.
    const model = 'only-a'
    const load = await pods.a.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${cluster.tokens.a}` },
      body: JSON.stringify({
        model_path: `org/${model}`,
        served_model_name: model,
        gpu_memory_utilization: 0.3,
      }),
    })
    expect(load.status).toBe(202)
    const served = await waitFor(
      'a chat sent to pod b served by pod a through the hop',
      async () => {
        const r = await fetch(`${pods.b.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
          signal: AbortSignal.timeout(10_000),
        })
        const j = (await r.json()) as { model?: string }
        return r.status === 200 ? j : undefined
      },
      { timeoutMs: 40_000, pollMs: 200 },
    )
    expect(served.model).toBe(model)
  }, 90_000)

  it('counts failures from the head too: a flood of strangers meets 429 before any check', async () => {
    const stranger = () => fakeHead({ to: 'b', length: 120 * MB })
    // From 127.0.0.3 (no member's address): each refused from its head, each counted.
    const first = await Promise.all(
      Array.from({ length: RATE }, () => headOnly(port('b'), stranger(), '127.0.0.3')),
    )
    expect(new Set(first.map((r) => r.code))).toEqual(new Set(['WRONG_SOURCE_ADDRESS']))
    const next = await headOnly(port('b'), stranger(), '127.0.0.3')
    expect(next.status).toBe(429)
    expect(next.code).toBe('RATE_LIMITED')
  }, 60_000)
})

/** wakeOn: notify on every byte or close on any of `conns` (for waitFor). */
function wakeOn(conns: NetRaw[], notify: () => void): () => void {
  const offs = conns.map((c) => {
    const on = () => notify()
    c.socket.on('data', on)
    c.socket.on('close', on)
    return () => {
      c.socket.off('data', on)
      c.socket.off('close', on)
    }
  })
  return () => {
    for (const off of offs) off()
  }
}

describe('the internal API from the head, a member advertised by host name', () => {
  let gw: TestGateway
  let gwPort: number

  beforeAll(async () => {
    gwPort = await freePort()
    gw = await startGateway({
      ports: [27230, 27239],
      server: { port: gwPort },
      extraYaml:
        '  cluster: { pod_id: solo, coordination: { kind: static, static: { leader: solo, ' +
        "peers: [{ pod_id: named, address: 'http://localhost:1' }] } } }\n",
      hostEnv: AUTH,
    })
  })

  afterAll(async () => {
    await gw?.stop()
  })

  it('takes its requests from what the name resolves to, and refuses them from elsewhere', async () => {
    // Resolved at start: from 127.0.0.1 the head passes and the fake signature is what is refused.
    const res = await waitFor(
      'the head of a request from "named" to pass',
      async () => {
        const c = await NetRaw.open(gwPort)
        try {
          c.write(`${fakeHead({ pod: 'named', to: 'solo', length: 2 })}{}`)
          const r = await answered(c, 'an answer')
          return r.status === 503 ? undefined : r
        } finally {
          c.socket.destroy()
        }
      },
      { timeoutMs: 10_000, pollMs: 100 },
    )
    expect(res.status).toBe(401)
    expect(res.message).toBe('Invalid cluster signature')
    const elsewhere = await headOnly(
      gwPort,
      fakeHead({ pod: 'named', to: 'solo', length: 120 * MB }),
      '127.0.0.2',
    )
    expect(elsewhere.status).toBe(403)
    expect(elsewhere.code).toBe('WRONG_SOURCE_ADDRESS')
    expect(elsewhere.message).toBe("Pod 'named' is at 'localhost'; this request comes from 127.0.0.2")
  })
})
