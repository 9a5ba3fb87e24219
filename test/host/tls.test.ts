import { afterAll, beforeAll, describe, expect, it, setDefaultTimeout } from 'bun:test'
import { copyFileSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import tls from 'node:tls'
import { encodeRequest, HttpStreamClient } from '../../plugins/benchmarks/http-stream.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'
import { selfTrust } from '../../src/host/tls.ts'
import { routerPlugin } from '../router/support.ts'
import { makeCert as selfSigned } from '../support/certs.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'

/**
 * `server.tls`: every listener (the main one and a plugin's, the router's here) speaks HTTPS with
 * the configured certificate, real sockets throughout. Plain HTTP and TLS 1.1 are refused; a
 * certificate renamed over the old one (as certbot does) is taken for new connections without a
 * restart while a connection opened before keeps being answered; bad replacement files keep the
 * old certificate and are logged; a missing file stops start-up naming its key; a port in use still
 * fails start-up although the TLS listener shares its port (SO_REUSEPORT) for the swap.
 */
setDefaultTimeout(60_000)

const dir = mkdtempSync(join(tmpdir(), 'modelgate-tls-'))
const certFile = join(dir, 'live', 'cert.pem')
const keyFile = join(dir, 'live', 'key.pem')

/** makeCert: a self-signed certificate as <name>.crt/.key in this test's dir (test/support/certs.ts). */
const makeCert = (name: string, cn: string, san?: string) => selfSigned(dir, name, cn, san)

/** install renames `name`'s files over the live ones (key first, then the certificate), as certbot does. */
function install(name: string): void {
  for (const [from, to] of [
    [`${name}.key`, keyFile],
    [`${name}.crt`, certFile],
  ] as const) {
    const tmp = `${to}.new`
    copyFileSync(join(dir, from), tmp)
    renameSync(tmp, to)
  }
}

/** peer: the common name of the certificate a new TLS connection to `port` is shown. */
function peerCN(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false }, () => {
      resolve(String(c.getPeerCertificate().subject.CN))
      c.end()
    })
    c.on('error', reject)
  })
}

/** KeepAlive: one TLS connection carrying GET requests one after another. */
class KeepAlive {
  private buf = ''
  private wake: (() => void) | null = null
  readonly socket: tls.TLSSocket
  readonly ready: Promise<void>

  constructor(port: number, ca: string) {
    this.socket = tls.connect({ host: '127.0.0.1', port, ca })
    this.ready = new Promise((resolve, reject) => {
      this.socket.once('secureConnect', () => resolve())
      this.socket.once('error', reject)
    })
    this.socket.on('data', (d) => {
      this.buf += d.toString('latin1')
      this.wake?.()
    })
  }

  get cn(): string {
    return String(this.socket.getPeerCertificate().subject.CN)
  }

  /** get sends one request and returns the status of its (Content-Length framed) response. */
  async get(path: string): Promise<number> {
    this.socket.write(`GET ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: keep-alive\r\n\r\n`)
    const response = await waitFor(
      `a response to GET ${path}`,
      () => {
        const end = this.buf.indexOf('\r\n\r\n')
        if (end < 0) return null
        const head = this.buf.slice(0, end)
        const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0)
        if (this.buf.length < end + 4 + length) return null
        this.buf = this.buf.slice(end + 4 + length)
        return head
      },
      {
        wake: (notify) => {
          this.wake = notify
          return () => {
            this.wake = null
          }
        },
      },
    )
    return Number(response.split(' ')[1])
  }
}

let a: { cert: string; key: string }
let b: { cert: string; key: string }
let th: TestHost
let routerPort = 0
let mainPort = 0

const tlsServer = (extra: Record<string, string> = {}) => ({
  tls: { cert_file: certFile, key_file: keyFile, ...extra },
})

beforeAll(async () => {
  Bun.spawnSync(['mkdir', '-p', join(dir, 'live')])
  a = makeCert('a', 'cert-a')
  b = makeCert('b', 'cert-b')
  install('a')
  th = await startHost(
    'plugins:\n  router:\n    host: 127.0.0.1\n    port: 0\n    models: []\n',
    [routerPlugin as PluginDefinition],
    {},
    undefined,
    { server: tlsServer() },
  )
  mainPort = new URL(th.url).port ? Number(new URL(th.url).port) : 0
  routerPort = Number(new URL(th.host.urls.router!).port)
})

afterAll(async () => {
  await th?.stop()
  rmSync(dir, { recursive: true, force: true })
})

describe('server.tls', () => {
  it('serves HTTPS on the main listener and on the router listener, trusted with the certificate', async () => {
    expect(th.url).toStartWith('https://127.0.0.1:')
    expect(th.host.urls.router).toStartWith('https://127.0.0.1:')
    const r = await fetch(`${th.url}/api/health`, { tls: { ca: a.cert } })
    expect(r.status).toBe(200)
    const router = await fetch(`${th.host.urls.router}/docs`, { tls: { ca: a.cert } })
    expect(router.status).toBeLessThan(500)
    expect(await peerCN(routerPort)).toBe('cert-a')
    expect(th.host.selfCa).toBe(a.cert)
  })

  it('a certificate that is not trusted is refused by a verifying client', async () => {
    await expect(fetch(`${th.url}/api/health`)).rejects.toThrow()
  })

  it('refuses plain HTTP', async () => {
    const plain = th.url.replace('https://', 'http://')
    await expect(fetch(`${plain}/api/health`, { signal: AbortSignal.timeout(10_000) })).rejects.toThrow()
  })

  it('refuses a TLS 1.1 client', async () => {
    const outcome = await new Promise<string>((resolve) => {
      const c = tls.connect(
        {
          host: '127.0.0.1',
          port: mainPort,
          ca: a.cert,
          minVersion: 'TLSv1',
          maxVersion: 'TLSv1.1',
        },
        () => {
          resolve(`accepted ${c.getProtocol()}`)
          c.end()
        },
      )
      c.on('error', (e) => resolve(`refused: ${e.message}`))
    })
    expect(outcome).toStartWith('refused')
  })

  it("the benchmark's client (the proxy's pool) reaches its own listener, trusting the certificate", async () => {
    const client = new HttpStreamClient({ ca: a.cert })
    const url = new URL('/api/health', th.url)
    const status = await new Promise<{ status: number; error: string | null }>((resolve) =>
      client.request(url, encodeRequest(url, {}, '{}'), {
        body() {},
        end: (status, error) => resolve({ status, error }),
      }),
    )
    client.close()
    // Any HTTP answer (a POST to a GET route) shows the TLS connection verified.
    expect(status.status).toBeGreaterThan(0)
  })

  it('takes a certificate renamed over the old one for new connections; an open connection keeps being served', async () => {
    const before = new KeepAlive(mainPort, a.cert)
    await before.ready
    expect(await before.get('/api/health')).toBe(200)
    expect(before.cn).toBe('cert-a')
    const connections = th.host.fronts.main!.conns.size

    install('b')
    await waitFor('new connections to show cert-b', async () => (await peerCN(mainPort)) === 'cert-b', {
      pollMs: 200,
    })
    await waitFor('the router listener to show cert-b', async () => (await peerCN(routerPort)) === 'cert-b', {
      pollMs: 200,
    })
    expect(th.logs.filter((l) => l.includes('TLS certificate reloaded')).length).toBe(1)
    expect(th.host.selfCa).toBe(b.cert)

    // The connection opened before the swap is still answered, on its old certificate.
    expect(await before.get('/api/health')).toBe(200)
    expect(await before.get('/api/health')).toBe(200)
    expect(before.cn).toBe('cert-a')
    // One set of connections across the swap: the old one is still counted by the front.
    expect(th.host.fronts.main!.conns.size).toBeGreaterThanOrEqual(connections)

    const r = await fetch(`${th.url}/api/health`, { tls: { ca: b.cert } })
    expect(r.status).toBe(200)
    before.socket.destroy()
  })

  it('invalid replacement files keep the certificate in use and log an error', async () => {
    const errorsBefore = th.logs.filter((l) => l.includes('TLS certificate not reloaded')).length
    const tmp = `${certFile}.new`
    writeFileSync(tmp, 'not a certificate\n')
    renameSync(tmp, certFile)
    await waitFor(
      'the bad certificate to be logged',
      () => th.logs.filter((l) => l.includes('TLS certificate not reloaded')).length > errorsBefore,
    )
    const line = th.logs.findLast((l) => l.includes('TLS certificate not reloaded'))
    expect(line).toContain('server.tls.cert_file')
    expect(await peerCN(mainPort)).toBe('cert-b')
    const r = await fetch(`${th.url}/api/health`, { tls: { ca: b.cert } })
    expect(r.status).toBe(200)
    // A key that is not the certificate's is refused the same way.
    install('a')
    copyFileSync(join(dir, 'b.key'), `${keyFile}.new`)
    renameSync(`${keyFile}.new`, keyFile)
    await waitFor('the mismatched key to be logged', () =>
      th.logs.some((l) => l.includes('is not the key of the certificate')),
    )
    expect(await peerCN(mainPort)).toBe('cert-b')
    // Good files again: taken.
    install('a')
    await waitFor('cert-a again', async () => (await peerCN(mainPort)) === 'cert-a', { pollMs: 200 })
  })

  it("the image's health check speaks HTTPS with MODELGATE_TLS_CERT, trusting the certificate file", async () => {
    const check = async (extra: Record<string, string>) => {
      // Async: a spawnSync would block this process, which serves the listener checked.
      const p = Bun.spawn(['python3', join(import.meta.dir, '../../config/healthcheck.py')], {
        env: { PATH: process.env.PATH ?? '', MODELGATE_PORT: String(mainPort), ...extra },
        stderr: 'pipe',
      })
      return { code: await p.exited, err: await new Response(p.stderr).text() }
    }
    expect(await check({ MODELGATE_TLS_CERT: certFile })).toEqual({ code: 0, err: '' })
    // Another certificate is not trusted, and plain HTTP gets no answer.
    const other = await check({ MODELGATE_TLS_CERT: join(dir, 'b.crt') })
    expect(other.code).toBe(1)
    expect(other.err).toContain('CERTIFICATE_VERIFY_FAILED')
    expect((await check({})).code).toBe(1)
  })

  it('a second modelgate on the port a TLS listener holds fails start-up as without TLS', async () => {
    const port = mainPort
    await expect(startHost('', [], {}, undefined, { server: { port, ...tlsServer() } })).rejects.toThrow(
      `main listener: 127.0.0.1:${port} is already in use`,
    )
    // And a plain listener on it too.
    await expect(startHost('', [], {}, undefined, { server: { port } })).rejects.toThrow(
      `127.0.0.1:${port} is already in use`,
    )
  })

  it('a missing certificate file stops start-up naming server.tls.cert_file', async () => {
    await expect(
      startHost('', [], {}, undefined, { server: tlsServer({ cert_file: join(dir, 'nowhere.pem') }) }),
    ).rejects.toThrow('server.tls.cert_file: cannot read')
    await expect(
      startHost('', [], {}, undefined, { server: tlsServer({ key_file: join(dir, 'a.crt') }) }),
    ).rejects.toThrow('server.tls.key_file')
  })

  it('serve exits 2 on a missing certificate file, naming server.tls.cert_file, before it listens', async () => {
    const file = join(dir, 'serve.yaml')
    writeFileSync(
      file,
      `data_dir: ${join(dir, 'serve-data')}\nserver: { host: 127.0.0.1, port: 0, tls: { cert_file: ${join(dir, 'nowhere.pem')}, key_file: ${keyFile} } }\n`,
    )
    const p = Bun.spawn(
      [process.execPath, join(import.meta.dir, '../../src/main.ts'), 'serve', '--config', file],
      {
        env: { PATH: process.env.PATH ?? '' },
        stderr: 'pipe',
        stdout: 'pipe',
      },
    )
    const code = await p.exited
    const err = await new Response(p.stderr).text()
    expect(code).toBe(2)
    expect(err).toContain(`server.tls.cert_file: cannot read ${join(dir, 'nowhere.pem')}: no such file`)
    expect(err).not.toContain('listening')
  })

  it('after shutdown the swapped listener is closed', async () => {
    const other = await startHost('', [], {}, undefined, { server: tlsServer() })
    const port = Number(new URL(other.url).port)
    install('b')
    await waitFor('cert-b', async () => (await peerCN(port)) === 'cert-b', { pollMs: 200 })
    await other.stop()
    await expect(peerCN(port)).rejects.toThrow()
  })
})

/** status: the status of a POST to `url` by the benchmark's client (the proxy's pool) with `opts`, or its error. */
function poolStatus(url: URL, opts: ConstructorParameters<typeof HttpStreamClient>[0]): Promise<string> {
  const client = new HttpStreamClient(opts)
  return new Promise<string>((resolve) =>
    client.request(url, encodeRequest(url, {}, '{}'), {
      body() {},
      end: (status, error) => {
        client.close()
        resolve(status > 0 ? `status ${status}` : `error ${error}`)
      },
    }),
  )
}

describe('calls to its own listener with a certificate for a public name', () => {
  it('checks the certificate against its DNS name when it does not name the address called', async () => {
    const pub = makeCert('pub', 'modelgate.example.com', 'DNS:modelgate.example.com')
    const other = await startHost('', [], {}, undefined, {
      server: { tls: { cert_file: join(dir, 'pub.crt'), key_file: join(dir, 'pub.key') } },
    })
    try {
      const url = new URL('/api/health', other.url)
      const trust = selfTrust(pub.cert, '127.0.0.1')
      expect(trust).toEqual({ ca: [pub.cert], serverName: 'modelgate.example.com' })
      expect(await poolStatus(url, trust)).toMatch(/^status \d+/)
      // Verification is on: without the name the certificate does not match 127.0.0.1.
      expect(await poolStatus(url, { ca: pub.cert })).toContain('TLS handshake failed')
      const r = await fetch(`${other.url}/api/health`, { tls: trust } as RequestInit)
      expect(r.status).toBe(200)
    } finally {
      await other.stop()
    }
  })

  it('a certificate a CA issued chains to the system roots too; one naming the address needs no name', () => {
    const self = makeCert('ip', 'ip', 'IP:127.0.0.1')
    expect(selfTrust(self.cert, '127.0.0.1')).toEqual({ ca: [self.cert] })
    const wild = makeCert('wild', 'wild', 'DNS:*.example.com')
    expect(selfTrust(wild.cert, '0.0.0.0').serverName).toBe('modelgate.example.com')
    const root = join(dir, 'root')
    const run = (args: string[]) => expect(Bun.spawnSync(['openssl', ...args]).exitCode).toBe(0)
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
    run([
      'req',
      '-x509',
      ...ec,
      '-keyout',
      `${root}.key`,
      '-out',
      `${root}.crt`,
      '-days',
      '2',
      '-subj',
      '/CN=root',
    ])
    run(['req', ...ec, '-keyout', `${root}-leaf.key`, '-out', `${root}-leaf.csr`, '-subj', '/CN=leaf'])
    run([
      'x509',
      '-req',
      '-in',
      `${root}-leaf.csr`,
      '-CA',
      `${root}.crt`,
      '-CAkey',
      `${root}.key`,
      '-out',
      `${root}-leaf.crt`,
      '-days',
      '2',
    ])
    const issued = selfTrust(readFileSync(`${root}-leaf.crt`, 'utf8'), '127.0.0.1')
    expect(issued.ca.length).toBeGreaterThan(10)
  })
})
