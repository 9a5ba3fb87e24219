import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { addressedTo, signRequest } from '../../plugins/cluster/signing.ts'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { parse, Raw, rawExchange } from '../support/raw-client.ts'

/**
 * The internal API as a peer that holds the secret but sends garbage meets it (a buggy or
 * compromised pod): every body is validly signed, so it passes the signature check and reaches the
 * limits and validation behind it. Each must be a 4xx in the controller shape, never a 500, a hang or
 * a changed state; a slow body gets 408. Auth is on (simple mode, inference key). The peer, `mallory`,
 * is a member (listed in the static configuration, at this machine's address), so the head stage's
 * sender check lets its requests through to what is tested here.
 */
const SECRET = 'hostile-internal-secret-0123456789'

/** The pods this pod knows, before and after every hostile request: the static list. */
const MEMBERS = ['mallory', 'solo']

let gw: TestGateway
let port: number

/** signedHead: the head of a request to `path`, addressed to this pod (`solo`) and signed. */
function signedHead(method: string, path: string, body: Uint8Array, extra = ''): string {
  const ts = Date.now()
  const target = addressedTo(path, 'solo')
  const sig = signRequest(SECRET, method, target, ts, body)
  return (
    `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
    `content-length: ${body.length}\r\nx-cluster-signature: ${sig}\r\nx-cluster-timestamp: ${ts}\r\n` +
    `x-cluster-pod: mallory\r\nx-cluster-term: 1\r\n${extra}connection: close\r\n\r\n`
  )
}

async function post(target: string, body: string | Uint8Array) {
  const bytes = typeof body === 'string' ? Buffer.from(body) : body
  const reply = await rawExchange(
    port,
    Buffer.concat([Buffer.from(signedHead('POST', target, bytes), 'latin1'), bytes]),
    {
      waitMs: 10_000,
    },
  )
  const [res] = parse(reply.text)
  return {
    status: res!.status,
    body: res!.body ? (JSON.parse(res!.body) as { error?: { code: string } }) : null,
  }
}

async function pods(): Promise<string[]> {
  const r = await gw.json<{ pods: { podId: string }[] }>('/api/cluster/pods', {
    headers: { authorization: `Bearer ${await token()}` },
  })
  return r.body.pods.map((p) => p.podId)
}

let jwt = ''
async function token(): Promise<string> {
  if (jwt) return jwt
  const r = await fetch(`${gw.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: 'pw' }),
  })
  jwt = ((await r.json()) as { token: string }).token
  return jwt
}

beforeAll(async () => {
  port = await freePort()
  gw = await startGateway({
    ports: [27140, 27149],
    server: { port, max_admin_body_bytes: 65536, request_head_timeout_seconds: 1 },
    extraYaml:
      '  cluster: { pod_id: solo, coordination: { kind: static, static: { leader: solo, ' +
      "peers: [{ pod_id: mallory, address: 'http://127.0.0.1:1' }] } } }\n",
    hostEnv: {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'pw',
      JWT_SECRET: 'j'.repeat(40),
      INFERENCE_API_KEY: 'inference-key',
      CLUSTER_SECRET: SECRET,
    },
  })
})

afterAll(async () => {
  await gw?.stop()
})

describe('the internal API against signed hostile bodies', () => {
  it('answers malformed JSON with 400 VALIDATION_ERROR', async () => {
    const r = await post('/internal/heartbeat', '{"state": {"podId": ')
    expect(r.status).toBe(400)
    expect(r.body?.error?.code).toBe('VALIDATION_ERROR')
  })

  it('answers a body of the wrong shape with 400, and nobody joins', async () => {
    expect(await pods()).toEqual(MEMBERS)
    const r = await post(
      '/internal/heartbeat',
      JSON.stringify({ state: { podId: 'x', models: 'all of them' } }),
    )
    expect(r.status).toBe(400)
    expect(await pods()).toEqual(MEMBERS)
  })

  it('refuses a deeply nested body before anything parses it', async () => {
    const deep = `${'['.repeat(5000)}${']'.repeat(5000)}`
    const r = await post('/internal/cluster/event', deep)
    expect(r.status).toBe(400)
  })

  it('refuses an oversized body from its head with 413', async () => {
    const r = await post('/internal/cluster/event', JSON.stringify({ pad: 'x'.repeat(70_000) }))
    expect(r.status).toBe(413)
  })

  it('refuses an event whose pod id is absurdly long, and an unknown event type', async () => {
    const at = new Date().toISOString()
    const long = await post(
      '/internal/cluster/event',
      JSON.stringify({ type: 'pod-left', podId: 'p'.repeat(300), at }),
    )
    expect(long.status).toBe(400)
    const unknown = await post(
      '/internal/cluster/event',
      JSON.stringify({ type: 'pod-exploded', podId: 'p', at }),
    )
    expect(unknown.status).toBe(400)
  })

  it('gives a signed body that never finishes 408, and still serves others', async () => {
    const body = Buffer.from(JSON.stringify({ type: 'pod-left', podId: 'x', at: new Date().toISOString() }))
    const slow = await Raw.open(port)
    // The head promises the whole body; only its first byte is ever sent.
    slow.write(signedHead('POST', '/internal/cluster/event', body))
    slow.write(body.subarray(0, 1))
    await slow.waitFor((c) => c.closed || c.text.includes('\r\n\r\n'), 10_000, 'a 408 or a close')
    expect(slow.text).toMatch(/^HTTP\/1\.1 408/)
    slow.socket.terminate()
    expect(await pods()).toEqual(MEMBERS)
  })

  it('refuses the same signed request sent twice (replay) without acting on it again', async () => {
    const body = Buffer.from(
      JSON.stringify({ type: 'pod-joined', podId: 'ghost', at: new Date().toISOString() }),
    )
    const bytes = Buffer.concat([
      Buffer.from(signedHead('POST', '/internal/cluster/event', body), 'latin1'),
      body,
    ])
    const first = parse((await rawExchange(port, bytes, { waitMs: 10_000 })).text)[0]!
    const second = parse((await rawExchange(port, bytes, { waitMs: 10_000 })).text)[0]!
    expect(first.status).toBe(200)
    expect(second.status).toBe(401)
  })
})
