import { connect, type Socket as NetSocket } from 'node:net'
import type { Socket } from 'bun'
import { waitFor } from './wait.ts'

/**
 * A raw HTTP/1.1 client for tests that must send what fetch never would (bare LF, short or broken
 * Host, odd targets, slow heads) and read exactly the bytes that came back: Raw is one TCP
 * connection, rawExchange one request on a new connection, parse splits the reply bytes into
 * responses. Waits are on data events, each with a deadline that throws.
 */
export class Raw {
  buf = Buffer.alloc(0)
  closed = false
  socket!: Socket<Raw>
  private readonly listeners = new Set<() => void>()

  static async open(port: number): Promise<Raw> {
    const r = new Raw()
    const on = (s: Socket<Raw>) => {
      s.data.closed = true
      s.data.changed()
    }
    r.socket = await Bun.connect<Raw>({
      hostname: '127.0.0.1',
      port,
      data: r,
      socket: {
        data(s, d) {
          s.data.buf = Buffer.concat([s.data.buf, d])
          s.data.changed()
        },
        close: on,
        error: on,
      },
    })
    return r
  }
  get text(): string {
    return this.buf.toString('latin1')
  }
  write(b: string | Uint8Array): void {
    this.socket.write(typeof b === 'string' ? Buffer.from(b, 'latin1') : b)
  }
  private changed(): void {
    for (const f of this.listeners) f()
  }
  /** waitFor: true once pred holds, checked on each read and close; throws naming `what` at the deadline. */
  async waitFor(pred: (r: Raw) => boolean, ms: number, what = pred.toString()): Promise<true> {
    await waitFor(`the connection to hold ${what}`, () => pred(this), {
      timeoutMs: ms,
      wake: (notify) => {
        this.listeners.add(notify)
        return () => this.listeners.delete(notify)
      },
      show: () => ({ closed: this.closed, text: this.text.slice(-400) }),
    })
    return true
  }
}

/**
 * NetRaw is Raw over node:net, for what Bun.connect cannot do: connect from a chosen local address
 * (another client of 127.0.0.0/8 than 127.0.0.1), and tell a reset (ECONNRESET) from a clean close.
 */
export class NetRaw {
  buf = Buffer.alloc(0)
  closed = false
  /** The connection ended by a reset (or another socket error) rather than a FIN. */
  reset = false
  private readonly listeners = new Set<() => void>()

  private constructor(readonly socket: NetSocket) {
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d])
      this.changed()
    })
    socket.on('error', () => {
      this.reset = true
      this.changed()
    })
    socket.on('close', () => {
      this.closed = true
      this.changed()
    })
  }

  static open(port: number, localAddress?: string): Promise<NetRaw> {
    return new Promise((resolve, reject) => {
      const s = connect({ host: '127.0.0.1', port, ...(localAddress ? { localAddress } : {}) })
      const r = new NetRaw(s)
      s.once('connect', () => resolve(r))
      s.once('error', reject)
    })
  }

  get text(): string {
    return this.buf.toString('latin1')
  }

  /** write: false when the socket's buffer is full (await `drained` before writing more). */
  write(b: string | Uint8Array): boolean {
    if (this.closed || this.socket.destroyed) return false
    return this.socket.write(typeof b === 'string' ? Buffer.from(b, 'latin1') : b)
  }

  private changed(): void {
    for (const f of this.listeners) f()
  }

  async waitFor(pred: (r: NetRaw) => boolean, ms: number, what = pred.toString()): Promise<true> {
    await waitFor(`the connection to hold ${what}`, () => pred(this), {
      timeoutMs: ms,
      wake: (notify) => {
        this.listeners.add(notify)
        return () => this.listeners.delete(notify)
      },
      show: () => ({ closed: this.closed, reset: this.reset, text: this.text.slice(-400) }),
    })
    return true
  }
}

/** rawExchange writes bytes on a new connection and collects the reply until it closes or `until` holds (throws past waitMs). */
export async function rawExchange(
  port: number,
  bytes: string | Uint8Array,
  opts: { waitMs: number; until?: (text: string) => boolean },
): Promise<{ text: string; closed: boolean }> {
  const r = await Raw.open(port)
  try {
    r.write(bytes)
    const what = opts.until ? `a close or ${opts.until}` : 'a close'
    await r.waitFor((c) => c.closed || (opts.until?.(c.text) ?? false), opts.waitMs, what)
    return { text: r.text, closed: r.closed }
  } finally {
    r.socket.terminate()
  }
}

export interface Res {
  status: number
  head: string
  headers: Record<string, string>
  body: string
}
/** parse splits raw bytes (latin1) into the complete responses; bodies by length, chunked, or to the end. */
export function parse(text: string, headOnly: boolean[] = []): Res[] {
  const out: Res[] = []
  let i = 0
  while (i < text.length) {
    const end = text.indexOf('\r\n\r\n', i)
    if (end < 0) break
    const head = text.slice(i, end)
    const lines = head.split('\r\n')
    const status = Number(lines[0]!.split(' ')[1])
    const headers: Record<string, string> = {}
    for (const l of lines.slice(1)) {
      const c = l.indexOf(':')
      const name = l.slice(0, c).toLowerCase()
      headers[name] = headers[name] ? `${headers[name]}, ${l.slice(c + 1).trim()}` : l.slice(c + 1).trim()
    }
    i = end + 4
    let body = ''
    if (status >= 200 && status !== 204 && status !== 304 && !headOnly[out.length]) {
      if (headers['transfer-encoding'] === 'chunked') {
        for (;;) {
          const eol = text.indexOf('\r\n', i)
          const n = Number.parseInt(text.slice(i, eol), 16)
          if (eol < 0 || Number.isNaN(n) || text.length < eol + 4 + n) return out // incomplete
          i = eol + 2
          if (n === 0) {
            i += 2
            break
          }
          body += text.slice(i, i + n)
          i += n + 2
        }
      } else if (headers['content-length'] !== undefined) {
        const n = Number(headers['content-length'])
        if (text.length < i + n) return out
        body = text.slice(i, i + n)
        i += n
      } else {
        body = text.slice(i)
        i = text.length
      }
    }
    if (status >= 200) out.push({ status, head, headers, body })
  }
  return out
}
