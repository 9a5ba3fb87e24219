/**
 * flood: wrong inference keys at a listener, as fast as `--rate` allows, for `--ms`: each request a
 * new connection with a fresh random `mg-` key (a refusal from the head closes the connection, so an
 * attacker pays a connection per guess, as this does), at most `--conns` open at once; with
 * `--count N`, exactly N requests (or fewer if `--ms` ends first). Prints one JSON line:
 * {sent, refused, other, dropped, ms}: refused = answered 401, other = answered anything else or
 * not connected, dropped = closed before an answer. Run in its own process by
 * test/keys/timing.test.ts (counts) and test/perf/key-flood.ts (rates), so the flood's client costs
 * do not land on the listener's event loop.
 *
 *   bun test/keys/flood.ts --port P --rate 10000 --ms 3000 [--conns 64] [--count N]
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
const count = arg('--count', 0)
const body = '{"model":"model-a","messages":[]}'
let sent = 0
let refused = 0
let other = 0
let dropped = 0
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
      let answered = false
      Bun.connect({
        hostname: '127.0.0.1',
        port,
        socket: {
          open(s) {
            s.write(request())
          },
          data(s, d) {
            text += d.toString('latin1')
            if (!answered && text.includes('\r\n\r\n')) {
              answered = true
              if (text.startsWith('HTTP/1.1 401')) refused++
              else other++
              s.end()
              resolve()
            }
          },
          close() {
            if (!answered) dropped++
            answered = true
            resolve()
          },
          error() {
            if (!answered) dropped++
            answered = true
            resolve()
          },
          connectError() {
            if (!answered) other++
            answered = true
            resolve()
          },
        },
      }).catch(() => {
        if (!answered) other++
        answered = true
        resolve()
      })
    })
  } finally {
    open--
  }
}

// Paced: by each millisecond, `rate` per second are due; at most maxOpen in flight.
while (performance.now() < deadline && (count === 0 || sent < count)) {
  const due = Math.floor(((performance.now() - t0) * rate) / 1000)
  while (sent < due && open < maxOpen && (count === 0 || sent < count)) void one()
  await Bun.sleep(1)
}
while (open > 0) await Bun.sleep(5)
process.stdout.write(`${JSON.stringify({ sent, refused, other, dropped, ms: performance.now() - t0 })}\n`)
