import type { Socket, TCPSocketListener } from 'bun'

/**
 * A raw HTTP/1.1 server for client tests: it waits until each request is complete (head and
 * Content-Length body, latin1) and hands it to `answer`, which writes whatever bytes the test needs,
 * split or framed any way. Several requests may follow on one connection; `opened` counts the
 * connections, so a test can tell a reused one from a new one, and `closed` those that ended, so a
 * test can wait for the client to drop one.
 */
export interface RawHttpServer {
  readonly port: number
  /** Connections accepted so far (a test may reset it). */
  opened: number
  /** Connections closed so far, by either side. */
  closed: number
  /** nextClose resolves when a connection next closes (by either side). */
  nextClose(): Promise<void>
  stop(): void
}

interface RawConn {
  buf: string
}

export type RawAnswer = (socket: Socket<RawConn>, head: string, body: string) => void | Promise<void>

export function rawHttpServer(answer: RawAnswer): RawHttpServer {
  const closeWaiters: (() => void)[] = []
  const listener: TCPSocketListener<RawConn> = Bun.listen<RawConn>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(s) {
        server.opened++
        s.data = { buf: '' }
      },
      close() {
        server.closed++
        for (const f of closeWaiters.splice(0)) f()
      },
      data(s, d) {
        s.data.buf += d.toString('latin1')
        const end = s.data.buf.indexOf('\r\n\r\n')
        if (end < 0) return
        const head = s.data.buf.slice(0, end)
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0)
        if (s.data.buf.length < end + 4 + len) return
        const body = s.data.buf.slice(end + 4, end + 4 + len)
        s.data.buf = s.data.buf.slice(end + 4 + len)
        return answer(s, head, body)
      },
    },
  })
  const server: RawHttpServer = {
    port: listener.port,
    opened: 0,
    closed: 0,
    nextClose: () => new Promise<void>((resolve) => closeWaiters.push(resolve)),
    stop: () => listener.stop(true),
  }
  return server
}
