import { Connection, type Pending, type StreamCallbacks } from './http-connection.ts'
import { inbox } from './inbox.ts'

/**
 * HttpStreamClient is a small HTTP/1.1 client over raw TCP (Bun.connect) for the benchmark runner.
 * `fetch` queues beyond a fixed number of simultaneous requests per process and adds a promise per
 * body read; here every socket read is timestamped with `performance.now()` in the data callback
 * and fed straight to the SSE scanner, and keep-alive connections are pooled per target so warmup
 * requests leave open connections behind (as aiohttp's pool does for `vllm bench serve`).
 *
 * Supports `http:` and `https:` targets, chunked, content-length and close-delimited bodies.
 */
export type { StreamCallbacks }

/** IDLE_MAX_MS stays under uvicorn's default 5 s keep-alive so pooled sockets are rarely stale. */
const IDLE_MAX_MS = 4000

export class HttpStreamClient {
  private readonly idle = new Map<string, Connection[]>()
  private readonly all = new Set<Connection>()
  private closed = false

  /**
   * request sends one POST (`payload` from encodeRequest); callbacks fire from socket events, `end`
   * exactly once. Returns an abort function.
   */
  request(url: URL, payload: Uint8Array, callbacks: StreamCallbacks): (reason: string) => void {
    let current: Connection | null = null
    let aborted = false
    let ended = false
    const cb: StreamCallbacks = {
      body: (text, at) => callbacks.body(text, at),
      end(status, errorText, at) {
        if (ended) return
        ended = true
        callbacks.end(status, errorText, at)
      },
    }
    const key = `${url.protocol}//${url.host}`
    const attempt = (allowReuse: boolean) => {
      if (aborted) return
      if (this.closed) return cb.end(0, 'client closed', performance.now())
      const reused = allowReuse ? this.takeIdle(key) : null
      const pending: Pending = { payload, cb, reused: reused !== null, retry: () => attempt(false) }
      if (reused) {
        current = reused
        reused.send(pending)
        return
      }
      const conn = this.connect(url, (c) => {
        if (aborted) c.destroy()
        else c.send(pending)
      })
      conn.pending = pending
      current = conn
    }
    attempt(true)
    return (reason: string) => {
      if (aborted || ended) return
      aborted = true
      if (current && current.pending?.cb === cb) current.abort(reason)
      else cb.end(0, reason, performance.now())
    }
  }

  /**
   * preconnect opens keep-alive connections until `n` are idle for the target, so the first wave of
   * measured requests does not pay for TCP setup. Resolves when they are open (or failed).
   */
  preconnect(url: URL, n: number, signal: AbortSignal): Promise<void> {
    const key = `${url.protocol}//${url.host}`
    const missing = n - (this.idle.get(key)?.length ?? 0)
    if (missing <= 0 || this.closed) return Promise.resolve()
    return new Promise((resolve) => {
      let left = missing
      const settle = () => {
        if (--left === 0) resolve()
      }
      signal.addEventListener('abort', () => resolve(), { once: true })
      for (let i = 0; i < missing; i++) {
        const conn = this.connect(url, (c) => {
          c.onGiveUp = null
          c.idleSince = performance.now()
          this.release(c)
          settle()
        })
        conn.onGiveUp = settle
      }
    })
  }

  private connect(url: URL, opened: (c: Connection) => void): Connection {
    const key = `${url.protocol}//${url.host}`
    const conn = new Connection(key, (c) => this.release(c))
    this.all.add(conn)
    const port = Number(url.port) || (url.protocol === 'https:' ? 443 : 80)
    Bun.connect<Connection>({
      hostname: url.hostname.replace(/^\[|\]$/g, ''),
      port,
      tls: url.protocol === 'https:',
      data: conn,
      socket: {
        open(s) {
          s.setNoDelay(true)
          s.data.socket = s
          if (s.data.closed) {
            s.terminate()
            return
          }
          opened(s.data)
        },
        data: (s, data) => inbox.data(s.data, data, performance.now()),
        drain: (s) => s.data.drain(),
        close: (s, err) => {
          this.all.delete(s.data)
          inbox.close(s.data, err)
        },
        error: (s, err) => inbox.close(s.data, err),
        connectError: (s, err) => {
          this.all.delete(s.data)
          inbox.close(s.data, err)
        },
      },
    }).catch((err: unknown) => {
      this.all.delete(conn)
      if (!conn.closed) conn.onClose(err instanceof Error ? err : new Error(String(err)))
    })
    return conn
  }

  private takeIdle(key: string): Connection | null {
    const list = this.idle.get(key)
    const now = performance.now()
    while (list && list.length > 0) {
      const c = list.pop()!
      if (!c.closed && now - c.idleSince < IDLE_MAX_MS) return c
      c.destroy()
    }
    return null
  }

  private release(c: Connection): void {
    if (this.closed) {
      c.destroy()
      return
    }
    let list = this.idle.get(c.key)
    if (!list) {
      list = []
      this.idle.set(c.key, list)
    }
    list.push(c)
  }

  /** close terminates every connection (idle or busy). */
  close(): void {
    this.closed = true
    for (const c of this.all) c.abort('client closed')
    for (const list of this.idle.values()) for (const c of list) c.destroy()
    this.all.clear()
    this.idle.clear()
  }
}

const encoder = new TextEncoder()

/** encodeRequest builds the bytes of a JSON POST; `body` may be pre-encoded and shared by requests. */
export function encodeRequest(
  url: URL,
  headers: Record<string, string>,
  body: string | Uint8Array,
): Uint8Array {
  const bytes = typeof body === 'string' ? encoder.encode(body) : body
  let head = `POST ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\nconnection: keep-alive\r\n`
  head += `content-type: application/json\r\naccept: text/event-stream\r\ncontent-length: ${bytes.length}\r\n`
  for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`
  const headBytes = encoder.encode(`${head}\r\n`)
  const out = new Uint8Array(headBytes.length + bytes.length)
  out.set(headBytes, 0)
  out.set(bytes, headBytes.length)
  return out
}
