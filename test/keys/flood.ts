/**
 * flood: wrong inference keys at a listener, as fast as `--rate` allows, for `--ms`: each request a
 * new connection with a fresh random `mg-` key (a refusal from the head closes the connection, so an
 * attacker pays a connection per guess, as this does), at most `--conns` open at once. Prints one
 * JSON line: {sent, refused, other, ms}. Run by test/keys/timing.test.ts in its own process, so the
 * flood's client costs do not land on the listener's event loop.
 *
 *   bun test/keys/flood.ts --port P --rate 10000 --ms 3000 [--conns 64]
 */
import { randomBytes } from 'node:crypto'

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? Number(process.argv[i + 1]) : fallback
}
const port = arg('--port', 0)
const rate = arg('--rate', 10_000)
const ms = arg('--ms', 3000)
const maxOpen = arg('--conns', 64)
const body = '{"model":"model-a","messages":[]}'
let sent = 0
let refused = 0
let other = 0
let open = 0
const t0 = performance.now()
const deadline = t0 + ms

function request(): string {
  const key = `mg-${randomBytes(32).toString('base64url')}`
  return (
    `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${key}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`
  )
}

async function one(): Promise<void> {
  open++
  sent++
  try {
    await new Promise<void>((resolve) => {
      let text = ''
      Bun.connect({
        hostname: '127.0.0.1',
        port,
        socket: {
          open(s) {
            s.write(request())
          },
          data(s, d) {
            text += d.toString('latin1')
            if (text.includes('\r\n\r\n')) {
              if (text.startsWith('HTTP/1.1 401')) refused++
              else other++
              s.end()
              resolve()
            }
          },
          close() {
            resolve()
          },
          error() {
            resolve()
          },
          connectError() {
            other++
            resolve()
          },
        },
      }).catch(() => resolve())
    })
  } finally {
    open--
  }
}

// Paced: by each millisecond, `rate` per second are due; at most maxOpen in flight.
while (performance.now() < deadline) {
  const due = Math.floor(((performance.now() - t0) * rate) / 1000)
  while (sent < due && open < maxOpen) void one()
  await Bun.sleep(1)
}
while (open > 0) await Bun.sleep(5)
process.stdout.write(`${JSON.stringify({ sent, refused, other, ms: performance.now() - t0 })}\n`)
