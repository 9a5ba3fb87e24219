import type { Socket, SocketHandler } from 'bun'

/**
 * The HTTP/1.1 client's connection pool: one stack of idle keep-alive connections per upstream
 * origin (most recently used first), and the TCP (or TLS, or Unix socket) connect with its deadline.
 * A connection is lent to one user at a time (its `user`): the proxy's WireExchange, or a
 * benchmark request (plugins/benchmarks/http-stream.ts), which receives the socket's data, drain and
 * close events straight from the socket callbacks, so a user that needs the arrival time of each
 * read stamps it there.
 *
 * An idle connection is reused only within IDLE_REUSE_MS: engines' uvicorn closes idle ones after
 * 5 s, and a request sent on a connection the server is closing would be lost.
 *
 * The proxy shares one pool (`upstreams`); a benchmark run has its own, closed with the run, so its
 * hundreds of warm connections never mix with the proxy's and are gone when the run ends.
 */
export interface ConnUser {
  onData(data: Buffer): void
  onDrain(): void
  onClose(conn: Conn, err?: Error): void
}

export interface Target {
  readonly key: string
  readonly hostname: string
  readonly port: number
  readonly tls: boolean
  /** unix: a Unix socket path (the host's internal listener) instead of hostname and port. */
  readonly unix?: string
  /** `host: h:p\r\n`, prebuilt. */
  readonly hostLine: string
  readonly pool: Pool
}

const IDLE_REUSE_MS = 3500

/**
 * writeAll writes what the socket takes now and returns the rest (null when all went out): Bun's
 * sockets do not buffer, so the caller keeps the rest and writes it again on drain.
 */
export function writeAll<T>(socket: Socket<T>, data: Uint8Array | string): Uint8Array | null {
  const n = socket.write(data)
  // Strings here are ASCII (header text as latin1 is turned into bytes first): one byte per char.
  if (n < 0 || n >= data.length) return null
  const buf = typeof data === 'string' ? Buffer.from(data, 'latin1') : data
  return buf.subarray(n)
}

export function codedError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code })
}

export class Conn {
  socket: Socket<Conn> | null = null
  user: ConnUser | null = null
  idleSince = 0
  /** served: the connection already carried a request (a close before any byte may be a stale reuse). */
  served = false
  closed = false
  /** TLS: the handshake succeeded, or why it failed; onSecure waits for it (see Pool.connect). */
  secured = false
  tlsError: Error | null = null
  onSecure: ((err: Error | null) => void) | null = null

  constructor(readonly target: Target) {}

  handshake(ok: boolean, err: Error | null): void {
    if (ok && !err) this.secured = true
    else this.tlsError = codedError('TlsError', `TLS handshake failed: ${err?.message ?? 'no reason given'}`)
    const waiting = this.onSecure
    this.onSecure = null
    waiting?.(this.tlsError)
  }

  onData(data: Buffer): void {
    if (this.user) this.user.onData(data)
    else this.destroy()
  }

  onClose(err?: Error): void {
    if (this.closed) return
    this.closed = true
    this.target.pool.forget(this)
    const reason = err ?? this.tlsError ?? undefined
    const waiting = this.onSecure
    this.onSecure = null
    waiting?.(reason ?? codedError('ConnectionClosed', 'the connection closed during the TLS handshake'))
    this.user?.onClose(this, reason)
  }

  /** release hands the connection back to its pool (at `now`, when the caller has just read the clock). */
  release(now = performance.now()): void {
    this.target.pool.release(this, now)
  }

  destroy(): void {
    if (this.closed) return
    this.closed = true
    this.target.pool.forget(this)
    this.socket?.terminate()
  }
}

const handlers: SocketHandler<Conn> = {
  data(s, d) {
    s.data.onData(d as Buffer)
  },
  drain(s) {
    s.data.user?.onDrain()
  },
  close(s, err) {
    s.data.onClose(err)
  },
  error(s, err) {
    s.data.onClose(err)
  },
  handshake(s, ok, err) {
    s.data.handshake(ok, err)
  },
}

export interface PoolOptions {
  /** Idle connections kept per origin; a connection released beyond it is closed. */
  maxIdlePerOrigin: number
  /**
   * ca: PEM certificates trusted for `https:` origins instead of the system's (a private CA).
   * Certificates are always verified.
   */
  ca?: string | string[]
  /**
   * serverName: the name `https:` certificates are checked against instead of the URL's host (a
   * call to this process's own listener on 127.0.0.1, whose certificate names its public name).
   */
  serverName?: string
}

export class Pool {
  private readonly targets = new Map<string, Target>()
  private readonly idle = new Map<string, Conn[]>()
  /** Every connection open or opening, for close(). */
  private readonly open = new Set<Conn>()
  /** The last origin looked up: consecutive requests mostly go to the same one (one string compare). */
  private lastOrigin = ''
  private lastTarget: Target | null = null
  private closed = false

  constructor(private readonly opts: PoolOptions = { maxIdlePerOrigin: 256 }) {}

  /** origin: the target of an `http://host:port` or `https://host:port` origin (no path). */
  origin(origin: string): Target {
    if (origin === this.lastOrigin && this.lastTarget) return this.lastTarget
    let target = this.targets.get(origin)
    if (!target) {
      const u = new URL(origin)
      const tls = u.protocol === 'https:'
      if (!tls && u.protocol !== 'http:') throw new Error(`not an http(s) origin: ${origin}`)
      target = {
        key: origin,
        hostname: u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname,
        port: u.port ? Number(u.port) : tls ? 443 : 80,
        tls,
        hostLine: `host: ${u.host}\r\n`,
        pool: this,
      }
      this.targets.set(origin, target)
    }
    this.lastOrigin = origin
    this.lastTarget = target
    return target
  }

  /** unix: the target of an HTTP server listening on a Unix socket. */
  unix(path: string): Target {
    const key = `unix:${path}`
    let target = this.targets.get(key)
    if (!target) {
      target = {
        key,
        hostname: '',
        port: 0,
        tls: false,
        unix: path,
        hostLine: 'host: localhost\r\n',
        pool: this,
      }
      this.targets.set(key, target)
    }
    return target
  }

  /** takeIdle: the most recently pooled live connection to target; `now` spares a clock read when known. */
  takeIdle(target: Target, now = performance.now()): Conn | null {
    const list = this.idle.get(target.key)
    if (!list) return null
    while (list.length > 0) {
      const c = list.pop()!
      if (c.closed) continue
      if (now - c.idleSince > IDLE_REUSE_MS) {
        // Everything below is older still.
        c.destroy()
        for (const old of list.splice(0)) old.destroy()
        return null
      }
      return c
    }
    return null
  }

  /** idleCount: live idle connections to target. */
  idleCount(target: Target): number {
    return this.idle.get(target.key)?.length ?? 0
  }

  release(conn: Conn, now: number): void {
    conn.user = null
    if (conn.closed) return
    if (this.closed) {
      conn.destroy()
      return
    }
    let list = this.idle.get(conn.target.key)
    if (!list) {
      list = []
      this.idle.set(conn.target.key, list)
    }
    if (list.length >= this.opts.maxIdlePerOrigin) {
      conn.destroy()
      return
    }
    conn.idleSince = now
    list.push(conn)
  }

  /** forget: a connection closed; it leaves the idle stack it was in. */
  forget(conn: Conn): void {
    this.open.delete(conn)
    if (conn.user) return
    const list = this.idle.get(conn.target.key)
    const i = list ? list.indexOf(conn) : -1
    if (i >= 0) list!.splice(i, 1)
  }

  /**
   * connect opens a connection within `timeoutMs` (0: no deadline). An `https:` connection is
   * handed out once its TLS handshake succeeded; a certificate that does not verify fails it with
   * the verifier's reason.
   */
  connect(target: Target, timeoutMs: number): Promise<Conn> {
    if (this.closed) return Promise.reject(codedError('PoolClosed', 'the connection pool is closed'))
    const conn = new Conn(target)
    this.open.add(conn)
    const opening = target.unix
      ? Bun.connect<Conn>({ unix: target.unix, socket: handlers, data: conn })
      : Bun.connect<Conn>({
          hostname: target.hostname,
          port: target.port,
          tls: target.tls && (this.opts.ca || this.opts.serverName) ? this.tlsOptions() : target.tls,
          socket: handlers,
          data: conn,
        })
    return new Promise<Conn>((resolve, reject) => {
      let settled = false
      const done = (err: Error | null) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        if (!err) return resolve(conn)
        conn.destroy()
        reject(err)
      }
      const timer =
        timeoutMs > 0
          ? setTimeout(
              () => done(codedError('ConnectTimeout', `no connection within ${timeoutMs} ms`)),
              timeoutMs,
            )
          : undefined
      opening.then(
        (socket) => {
          conn.socket = socket
          if (settled || conn.closed) {
            socket.terminate()
            done(conn.tlsError ?? codedError('ConnectionClosed', 'the connection closed as it opened'))
            return
          }
          if (!target.unix) socket.setNoDelay(true)
          if (target.tls && !conn.secured) conn.onSecure = done
          else done(null)
        },
        (err: Error) => {
          conn.closed = true
          this.open.delete(conn)
          done(err)
        },
      )
    })
  }

  private tlsOptions(): { ca?: string | string[]; serverName?: string } {
    const { ca, serverName } = this.opts
    return { ...(ca ? { ca } : {}), ...(serverName ? { serverName } : {}) }
  }

  /** close destroys every connection, idle or lent (their users see the close), and refuses new ones. */
  close(): void {
    this.closed = true
    const error = codedError('PoolClosed', 'the connection pool is closed')
    for (const c of [...this.open]) {
      // A destroyed connection reports no close of its own: its user is told here.
      const user = c.user
      c.destroy()
      user?.onClose(c, error)
    }
    this.idle.clear()
  }
}

/** upstreams: the proxy's pool (engines, routed pods, the framework's Unix socket). */
export const upstreams = new Pool()
