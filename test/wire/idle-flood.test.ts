import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Socket, TCPSocketConnectOptions } from 'bun'
import { plugins } from '../../plugins/index.ts'
import { connectionCap } from '../../src/host/limits.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { NetRaw, parse } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Connections that send nothing, opened from many addresses, must not deny a listener: with auth on
 * and the listener's shipped limits (max_connections derived from the open-file limit, 1024 per
 * address), 10,000 silent connections from 50 loopback addresses (127.0.0.2 … 127.0.0.51, 200
 * each) are held open by the client while an authenticated client, already connected or new, is
 * served, and the listener cuts the silent ones past its bound on connections without a head
 * (half of max_connections) long before their head deadline (60 s). No timing is asserted: the
 * deadlines below only guard against a hang.
 */
const KEY = 'idle-flood-inference-key-0123456789'
const ENV = {
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: 'idle-flood-password',
  JWT_SECRET: 'idle-flood-jwt-secret-of-at-least-32-bytes',
  INFERENCE_API_KEY: KEY,
}
const ADDRESSES = 50
const PER_ADDRESS = 200
const FLOOD = ADDRESSES * PER_ADDRESS
const MODELS = `GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${KEY}\r\n\r\n`

let th: TestHost
let simDir: string
let port: number

beforeAll(async () => {
  simDir = mkdtempSync(join(tmpdir(), 'modelgate-idle-flood-'))
  const yaml = gatewayYaml({ ports: [18570, 18579] }, simDir).replace(
    'log: { level: debug }',
    'log: { level: warn }',
  )
  th = await startHost(yaml, plugins, ENV)
  port = Number(new URL(th.url).port)
})

afterAll(async () => {
  await th?.stop()
  rmSync(simDir, { recursive: true, force: true })
})

/** Flood: silent client connections, and how many of them the server has closed. */
class Flood {
  readonly sockets: Socket<Flood>[] = []
  closed = 0
  private readonly wakers = new Set<() => void>()
  onClose(): void {
    this.closed++
    for (const w of this.wakers) w()
  }
  wake = (notify: () => void) => {
    this.wakers.add(notify)
    return () => this.wakers.delete(notify)
  }
  async open(port: number, localAddress: string): Promise<void> {
    let done = false
    const closed = () => {
      if (done) return
      done = true
      this.onClose()
    }
    this.sockets.push(
      await Bun.connect<Flood>({
        hostname: '127.0.0.1',
        port,
        localAddress,
        data: this,
        socket: { data() {}, close: closed, error: closed },
        // localAddress binds the client's end (Bun's types leave it out; node:net's name for it).
      } as unknown as TCPSocketConnectOptions<Flood>),
    )
  }
}

describe('silent connections from many addresses', () => {
  it(`${FLOOD} of them leave authenticated clients served, and are cut past the bound`, async () => {
    const cap = connectionCap()
    // The flood must be more than the listener holds, or there is nothing to show.
    expect(FLOOD).toBeGreaterThan(cap)
    // A client served before the flood, keeping its connection alive between requests.
    const kept = await NetRaw.open(port)
    kept.write(MODELS)
    await kept.waitFor((r) => parse(r.text).length === 1, 10_000, 'the first answer')
    expect(parse(kept.text)[0]!.status).toBe(200)

    const flood = new Flood()
    for (let i = 0; i < PER_ADDRESS; i++)
      await Promise.all(Array.from({ length: ADDRESSES }, (_, a) => flood.open(port, `127.0.0.${a + 2}`)))
    expect(flood.sockets.length).toBe(FLOOD)

    // While the flood is held: the connected client is answered again, and a new one is served.
    kept.write(MODELS)
    await kept.waitFor((r) => parse(r.text).length === 2 || r.closed, 30_000, 'the second answer')
    expect(parse(kept.text).map((r) => r.status)).toEqual([200, 200])
    const fresh = await NetRaw.open(port)
    fresh.write(MODELS)
    await fresh.waitFor((r) => parse(r.text).length === 1 || r.closed, 30_000, 'the new client’s answer')
    expect(parse(fresh.text)[0]?.status).toBe(200)

    // The listener closed the silent connections past half of max_connections (its bound on
    // connections without a head), well before their 60 s head deadline.
    const bound = Math.floor(cap / 2)
    await waitFor(
      'the server to cut the silent connections past its bound',
      () => flood.closed >= FLOOD - bound,
      {
        timeoutMs: 30_000,
        wake: flood.wake,
        show: () => ({ closed: flood.closed }),
      },
    )
    expect(flood.closed).toBeLessThan(FLOOD)
    for (const s of flood.sockets) s.terminate()
    kept.socket.destroy()
    fresh.socket.destroy()
  }, 120_000)
})
