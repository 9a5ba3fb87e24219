import type { Socket, SocketHandler } from 'bun'

/**
 * The HTTP/1.1 client's connection pool: one stack of idle keep-alive connections per upstream
 * origin (most recently used first), and the TCP connect with its deadline. A connection is lent to
 * one exchange at a time (its `user`), which receives the socket's data, drain and close events.
 * An idle connection is reused only within IDLE_REUSE_MS: engines' uvicorn closes idle ones after
 * 5 s, and a request sent on a connection the server is closing would be lost.
 */
export interface ConnUser {
  onData(data: Buffer): void
  onDrain(): void
  onClose(conn: Conn): void
}

export interface Target {
  key: string
  hostname: string
  port: number
  /** unix: a Unix socket path (the host's internal listener) instead of hostname and port. */
  unix?: string
  /** `host: h:p\r\n`, prebuilt. */
  hostLine: string
}

const IDLE_REUSE_MS = 3500
const MAX_IDLE_PER_ORIGIN = 256

const targets = new Map<string, Target>()
const idle = new Map<string, Conn[]>()

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

  constructor(readonly key: string) {}

  onData(data: Buffer): void {
    if (this.user) this.user.onData(data)
    else this.destroy()
  }

  onClose(): void {
    if (this.closed) return
    this.closed = true
    const list = idle.get(this.key)
    if (list && !this.user) {
      const i = list.indexOf(this)
      if (i >= 0) list.splice(i, 1)
    }
    this.user?.onClose(this)
  }

  destroy(): void {
    if (this.closed) return
    this.closed = true
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
  close(s) {
    s.data.onClose()
  },
  error(s) {
    s.data.onClose()
  },
}

export function targetOf(url: string): { target: Target; path: string } {
  const slash = url.indexOf('/', 7)
  return {
    target: originTarget(slash < 0 ? url : url.slice(0, slash)),
    path: slash < 0 ? '/' : url.slice(slash),
  }
}

/** The last origin looked up: consecutive requests mostly go to the same one (one string compare). */
let lastOrigin = ''
let lastTarget: Target | null = null

/** originTarget: the pool target of an `http://host:port` origin (no path). */
export function originTarget(origin: string): Target {
  if (origin === lastOrigin && lastTarget) return lastTarget
  let target = targets.get(origin)
  if (!target) {
    const u = new URL(origin)
    const hostname = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname
    target = { key: origin, hostname, port: u.port ? Number(u.port) : 80, hostLine: `host: ${u.host}\r\n` }
    targets.set(origin, target)
  }
  lastOrigin = origin
  lastTarget = target
  return target
}

/** unixTarget: the pool target of an HTTP server listening on a Unix socket. */
export function unixTarget(path: string): Target {
  const key = `unix:${path}`
  let target = targets.get(key)
  if (!target) {
    target = { key, hostname: '', port: 0, unix: path, hostLine: 'host: localhost\r\n' }
    targets.set(key, target)
  }
  return target
}

/** takeIdle: the most recently pooled live connection to key; `now` spares a clock read when known. */
export function takeIdle(key: string, now = performance.now()): Conn | null {
  const list = idle.get(key)
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

/** release pools a connection for reuse (at `now`, when the caller has just read the clock). */
export function release(conn: Conn, now = performance.now()): void {
  conn.user = null
  if (conn.closed) return
  let list = idle.get(conn.key)
  if (!list) {
    list = []
    idle.set(conn.key, list)
  }
  if (list.length >= MAX_IDLE_PER_ORIGIN) {
    conn.destroy()
    return
  }
  conn.idleSince = now
  list.push(conn)
}

export function connect(target: Target, timeoutMs: number): Promise<Conn> {
  const conn = new Conn(target.key)
  const opening = target.unix
    ? Bun.connect<Conn>({ unix: target.unix, socket: handlers, data: conn })
    : Bun.connect<Conn>({ hostname: target.hostname, port: target.port, socket: handlers, data: conn })
  return new Promise<Conn>((resolve, reject) => {
    let settled = false
    const timer =
      timeoutMs > 0
        ? setTimeout(() => {
            settled = true
            reject(codedError('ConnectTimeout', `no connection within ${timeoutMs} ms`))
          }, timeoutMs)
        : undefined
    opening.then(
      (socket) => {
        conn.socket = socket
        if (settled) return conn.destroy()
        settled = true
        clearTimeout(timer)
        if (!target.unix) socket.setNoDelay(true)
        resolve(conn)
      },
      (err) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        reject(err)
      },
    )
  })
}
