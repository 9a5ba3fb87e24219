/**
 * proxy-pipe is the proxy benchmark's floor: the least a proxy built on Bun's sockets can do. Each
 * client connection gets its own upstream connection and bytes are copied blindly both ways (no
 * HTTP parsing, routing, pooling, deadlines or metrics); a close on either side closes the other,
 * and a socket that does not take all bytes pauses its source until it drains. It is not a usable
 * proxy (it cannot choose an engine by model); its column shows what Bun's socket layer costs
 * before any proxy logic, next to nginx. Prints `{url, pid}` on stdout once listening.
 *
 *   bun test/perf/proxy-pipe.ts --upstream PORT
 */
import type { Socket } from 'bun'
import { numberArg } from './args.ts'

const UPSTREAM = numberArg('--upstream', 0)
if (!UPSTREAM) {
  console.error('usage: proxy-pipe.ts --upstream PORT')
  process.exit(2)
}

/** A socket's state: its peer, and the bytes read from it that the peer has not taken yet. */
interface Side {
  peer: Socket<Side> | null
  /** Read from this socket, not yet written to the peer (before it connected, or it was full). */
  held: Uint8Array[]
  closed: boolean
}

/** pass writes data to the side's peer; what the peer does not take waits for its drain. */
function pass(from: Socket<Side>, data: Uint8Array): void {
  const peer = from.data.peer
  if (!peer || from.data.held.length > 0) {
    from.data.held.push(Buffer.from(data))
    return
  }
  const n = peer.write(data)
  if (n < data.length) {
    from.data.held.push(data.subarray(Math.max(n, 0)))
    from.pause()
  }
}

/** drain writes what `to`'s peer held back for it, then resumes that peer. */
function drain(to: Socket<Side>): void {
  const from = to.data.peer
  if (!from) return
  const held = from.data.held
  while (held.length > 0) {
    const n = to.write(held[0]!)
    if (n < held[0]!.length) {
      held[0] = held[0]!.subarray(Math.max(n, 0))
      return
    }
    held.shift()
  }
  from.resume()
}

function close(s: Socket<Side>): void {
  s.data.closed = true
  const peer = s.data.peer
  if (peer && !peer.data.closed) peer.end()
}

const upstreamHandlers = {
  data: pass,
  drain,
  close,
  error: close,
}

const server = Bun.listen<Side>({
  hostname: '127.0.0.1',
  port: 0,
  socket: {
    async open(client) {
      client.data = { peer: null, held: [], closed: false }
      try {
        const up = await Bun.connect<Side>({
          hostname: '127.0.0.1',
          port: UPSTREAM,
          data: { peer: client, held: [], closed: false },
          socket: upstreamHandlers,
        })
        if (client.data.closed) {
          up.end()
          return
        }
        client.data.peer = up
        const early = client.data.held.splice(0)
        for (const b of early) pass(client, b)
      } catch {
        client.end()
      }
    },
    data: pass,
    drain,
    close,
    error: close,
  },
})
process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${server.port}`, pid: process.pid })}\n`)

const stop = () => {
  server.stop(true)
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
