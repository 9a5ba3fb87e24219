import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { routerYaml } from '../router/support.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { NetRaw, parse } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

/**
 * What an attacker tried on real listeners with auth on (simple mode, an inference key), and what
 * the front must do: judge the key from the head before reading a body, never parse an inference
 * body whole, bound the bodies it holds, cut connections that send no head, cap connections per
 * address, let a refused client read its refusal, keep engine controls away from the inference
 * key, and answer HEAD on an event stream. Every client here is a raw socket.
 */
const KEY = 'hardening-inference-key-0123456789'
const ENV = {
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: 'hardening-password',
  JWT_SECRET: 'hardening-jwt-secret-of-at-least-32-bytes',
  INFERENCE_API_KEY: KEY,
}
const MiB = 1024 * 1024

let th: TestHost
let simDir: string
let mainPort: number
let routerPort: number
let token: string

const head = (path: string, length: number, extra = '') =>
  `POST ${path} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n${extra}Content-Length: ${length}\r\n\r\n`

beforeAll(async () => {
  simDir = mkdtempSync(join(tmpdir(), 'modelgate-hardening-'))
  const yaml = gatewayYaml(
    { ports: [18560, 18569], extraYaml: routerYaml('from_gateway: true\nmodels: []') },
    simDir,
  ).replace('log: { level: debug }', 'log: { level: warn }')
  th = await startHost(yaml, plugins, ENV, undefined, {
    server: {
      request_head_timeout_seconds: 1,
      max_connections_per_address: 20,
      max_buffered_body_bytes: 100 * MiB,
    },
  })
  mainPort = Number(new URL(th.url).port)
  routerPort = Number(new URL(th.host.urls.router!).port)
  const login = await fetch(`${th.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: ENV.ADMIN_PASSWORD }),
  })
  token = ((await login.json()) as { token: string }).token
})

afterAll(async () => {
  await th?.stop()
  rmSync(simDir, { recursive: true, force: true })
})

describe('the inference key, judged from the head', () => {
  it.each([
    ['the main listener', () => mainPort, '/v1/chat/completions'],
    ['the main listener', () => mainPort, '/api/direct/18560/v1/chat/completions'],
    ["the router's listener", () => routerPort, '/v1/chat/completions'],
  ])(
    'on %s (%s), a 20 MB request without the key is refused before one body byte is sent',
    async (_l, port, path) => {
      for (const [auth, code] of [
        ['', 'missing_api_key'],
        [`Authorization: Bearer not-the-key\r\n`, 'invalid_api_key'],
      ] as const) {
        const c = await NetRaw.open(port())
        // Only the head: the 401 must come without the body.
        c.write(head(path, 20_000_000, auth))
        await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the 401')
        const [res] = parse(c.text)
        expect(res!.status).toBe(401)
        expect(res!.headers.connection).toBe('close')
        expect(JSON.parse(res!.body).error.code).toBe(code)
        c.socket.destroy()
      }
    },
  )

  it('lets a client that keeps sending its body read the refusal (lingering close), 30 times in a row', async () => {
    const body = Buffer.alloc(4 * MiB, 0x20)
    let refused = 0
    for (let k = 0; k < 30; k++) {
      const c = await NetRaw.open(mainPort)
      c.write(head('/v1/chat/completions', body.length))
      c.write(body)
      await c.waitFor((r) => r.closed, 10_000, 'the connection to end')
      if (!c.reset && parse(c.text)[0]?.status === 401) refused++
    }
    expect(refused).toBe(30)
  })

  it('a relayed body over max_admin_body_bytes gets its 413 while the client is still sending', async () => {
    const c = await NetRaw.open(mainPort)
    c.write(
      `POST /api/v1/models/load HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${token}\r\nContent-Length: ${20 * MiB}\r\n\r\n`,
    )
    c.write(Buffer.alloc(4 * MiB, 0x20))
    await c.waitFor((r) => r.closed, 10_000, 'the connection to end')
    expect(c.reset).toBe(false)
    const [res] = parse(c.text)
    expect(res!.status).toBe(413)
    expect(JSON.parse(res!.body)).toEqual({
      error: { code: 'PAYLOAD_TOO_LARGE', message: 'request body too large', statusCode: 413 },
    })
  })
})

describe('inference bodies with the key', () => {
  const deep = (bytes: number) => {
    const b = Buffer.alloc(bytes, 0x5b) // '[' all the way
    b.write('{"model":"m","x":', 0)
    return b
  }

  it('four 20 MB bodies of nested arrays at once are refused as too deep, and health answers meanwhile', async () => {
    const body = deep(20 * 1000 * 1000)
    const conns = await Promise.all([0, 1, 2, 3].map(() => NetRaw.open(mainPort)))
    for (const c of conns) {
      c.write(head('/v1/chat/completions', body.length, `Authorization: Bearer ${KEY}\r\n`))
      c.write(body)
    }
    const health = await fetch(`${th.url}/api/health`)
    expect(health.status).toBe(200)
    for (const c of conns) {
      await c.waitFor((r) => parse(r.text).length === 1, 30_000, 'the 400')
      const [res] = parse(c.text)
      expect(res!.status).toBe(400)
      expect(JSON.parse(res!.body).error).toEqual({
        message: 'JSON body nested deeper than 64',
        type: 'invalid_request_error',
        code: 'invalid_json',
      })
      c.socket.destroy()
    }
  })

  it('a body that would pass max_buffered_body_bytes gets 503 with Retry-After from its head', async () => {
    const auth = `Authorization: Bearer ${KEY}\r\n`
    // One body of 90 MiB held (still arriving) leaves less than the next one needs.
    const first = await NetRaw.open(mainPort)
    first.write(head('/v1/chat/completions', 90 * MiB, auth))
    first.write('{"model":"m"')
    await waitFor('the first body to be held', () => th.host.fronts.main!.bufferedBodyBytes >= 90 * MiB)
    const second = await NetRaw.open(mainPort)
    second.write(head('/v1/chat/completions', 20 * MiB, auth))
    await second.waitFor((r) => parse(r.text).length === 1, 5000, 'the 503')
    const [res] = parse(second.text)
    expect(res!.status).toBe(503)
    expect(res!.headers['retry-after']).toBe('1')
    first.socket.destroy()
    second.socket.destroy()
    // The held bytes are given back when the connection ends.
    await waitFor('the budget to be free again', () => th.host.fronts.main!.bufferedBodyBytes === 0)
  })
})

describe('connections', () => {
  it('caps connections from one address and cuts those that send no head at the head deadline', async () => {
    const idle = await Promise.all(Array.from({ length: 25 }, () => NetRaw.open(mainPort)))
    // Past max_connections_per_address (20), the front closes new ones before reading anything.
    await waitFor('five connections closed at once', () => idle.filter((c) => c.closed).length >= 5, {
      timeoutMs: 5000,
    })
    // Another address is served meanwhile.
    const other = await NetRaw.open(mainPort, '127.0.0.2')
    other.write('GET /api/health HTTP/1.1\r\nHost: a\r\n\r\n')
    await other.waitFor((r) => parse(r.text).length === 1, 5000, 'the health answer')
    expect(parse(other.text)[0]!.status).toBe(200)
    other.socket.destroy()
    // The twenty that never sent a byte are cut at the head deadline (1 s here), not the idle timeout.
    await waitFor('every silent connection cut', () => idle.every((c) => c.closed), { timeoutMs: 10_000 })
    for (const c of idle) c.socket.destroy()
  })
})

describe('what the framework behind the front never sees', () => {
  it('a 20 KiB head is refused by the front with 431 in the path’s shape, relayed or hot', async () => {
    const pad = `X-Pad: ${'a'.repeat(20 * 1024)}\r\n`
    for (const [path, body] of [
      [
        '/api/health',
        { error: { code: 'HEADERS_TOO_LARGE', message: 'request head too large', statusCode: 431 } },
      ],
      [
        '/v1/models',
        {
          error: {
            message: 'request head too large',
            type: 'invalid_request_error',
            code: 'HEADERS_TOO_LARGE',
          },
        },
      ],
    ] as const) {
      const c = await NetRaw.open(mainPort)
      c.write(`GET ${path} HTTP/1.1\r\nHost: a\r\n${pad}\r\n`)
      await c.waitFor((r) => parse(r.text).length === 1, 5000, 'the 431')
      const [res] = parse(c.text)
      expect(res!.status).toBe(431)
      expect(JSON.parse(res!.body)).toEqual(body)
      c.socket.destroy()
    }
  })

  it('HEAD on an event stream answers its headers at once, and the connection goes on', async () => {
    const c = await NetRaw.open(mainPort)
    c.write(`HEAD /api/configurations/events HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${token}\r\n\r\n`)
    await c.waitFor((r) => r.text.includes('\r\n\r\n'), 5000, 'the head')
    expect(c.text).toStartWith('HTTP/1.1 200 ')
    expect(c.text.toLowerCase()).toContain('content-type: text/event-stream')
    c.write('GET /api/health HTTP/1.1\r\nHost: a\r\n\r\n')
    await c.waitFor((r) => r.text.includes('"status"'), 5000, 'the next answer on the same connection')
    c.socket.destroy()
  })
})

describe('engine controls stay behind the admin API', () => {
  it('the inference key cannot sleep an engine or call a worker method through the direct proxy', async () => {
    const load = await fetch(`${th.url}/api/v1/models/load`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ model_path: 'org/hardening-model', enable_sleep_mode: true }),
    })
    expect(load.status).toBe(202)
    const { instance_id: id, port } = (await load.json()) as { instance_id: string; port: number }
    const status = async () =>
      (
        (await (
          await fetch(`${th.url}/api/v1/models/${id}`, { headers: { authorization: `Bearer ${token}` } })
        ).json()) as { model: { status: string } }
      ).model.status
    await waitFor('the instance active', async () => (await status()) === 'active', { timeoutMs: 20_000 })
    const key = { authorization: `Bearer ${KEY}` }
    for (const [method, path] of [
      ['POST', '/sleep?level=1'],
      ['POST', '/collective_rpc'],
      ['POST', '/wake_up'],
      ['POST', '/reset_prefix_cache'],
      ['GET', '/is_sleeping'],
    ] as const) {
      const res = await fetch(`${th.url}/api/direct/${port}${path}`, { method, headers: key })
      expect(res.status).toBe(404)
    }
    // The engine itself never slept: it says so, and a chat through the direct proxy is served.
    const sleeping = (await (await fetch(`http://127.0.0.1:${port}/is_sleeping`)).json()) as {
      is_sleeping: boolean
    }
    expect(sleeping.is_sleeping).toBe(false)
    expect(await status()).toBe('active')
    const chat = await fetch(`${th.url}/api/direct/${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { ...key, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'org/hardening-model',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 4,
      }),
    })
    expect(chat.status).toBe(200)
  }, 40_000)
})
