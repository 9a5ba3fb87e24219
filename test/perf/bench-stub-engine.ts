import type { Socket } from 'bun'

/**
 * bench-stub-engine is a minimal OpenAI-compatible streaming engine for measuring the benchmark
 * runner itself and for runner edge cases in tests. It speaks HTTP/1.1 over raw TCP so its clocks
 * are exact: a request is stamped when its bytes arrive (before any parsing) and every chunk when
 * it is written to the socket. Per request it records the stub-side TTFT (first content chunk
 * written − request bytes arrived), keyed by the `x-request-id` header. It runs in its own process
 * so it never shares the runner's event loop.
 *
 *   bun test/perf/bench-stub-engine.ts --port 0 [--ttft-ms 20] [--tokens-per-sec 100]
 *     [--no-tokenize] [--no-usage] [--fail-every N] [--max-model-len 8192] [--bos N]
 *     [--ttft-jitter-ms J]
 *
 * Prints `READY <port>` once listening. GET /stats returns {id: {ttft_ms, chunks}}; POST
 * /stats/reset clears it. Every Nth completion answers HTTP 500 with --fail-every N.
 */
const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? Number(args[i + 1]) : fallback
}
const port = flag('port', 0)
const ttftMs = flag('ttft-ms', 20)
/** --ttft-jitter-ms J: each request's TTFT is ttft-ms + uniform(0, J), which desynchronizes streams */
const ttftJitterMs = flag('ttft-jitter-ms', 0)
const tokensPerSec = flag('tokens-per-sec', 100)
const failEvery = flag('fail-every', 0)
const maxModelLen = flag('max-model-len', 8192)
const tokenize = !args.includes('--no-tokenize')
/** --bos N: /tokenize and usage count N extra tokens, like a tokenizer that adds a BOS token */
const bos = flag('bos', 0)
const usage = !args.includes('--no-usage')

interface StubRecord {
  ttft_ms: number
  chunks: number
  /** epoch ms (timeOrigin-based) when the request's bytes arrived and its first chunk was written */
  arrived_epoch: number
  first_sent_epoch: number
}
const records = new Map<string, StubRecord>()
let completions = 0

interface Conn {
  /** out holds bytes the socket did not take yet (written on drain). */
  out: Uint8Array[]
  buf: string
  arrived: number
  timer: ReturnType<typeof setTimeout> | undefined
  open: boolean
}

const wordCount = (s: string) => s.split(/\s+/).filter((w) => w !== '').length
const encoder = new TextEncoder()

/** send writes bytes, queueing what the socket does not take until it drains. */
function send(s: Socket<Conn>, data: Uint8Array | string): void {
  const bytes = typeof data === 'string' ? encoder.encode(data) : data
  if (s.data.out.length > 0) {
    s.data.out.push(bytes)
    return
  }
  const n = s.write(bytes)
  if (n < bytes.length) s.data.out.push(bytes.subarray(Math.max(0, n)))
}

function reply(s: Socket<Conn>, status: number, body: string, type = 'application/json'): void {
  const bytes = Buffer.byteLength(body)
  send(
    s,
    `HTTP/1.1 ${status} X\r\ncontent-type: ${type}\r\ncontent-length: ${bytes}\r\nconnection: keep-alive\r\n\r\n${body}`,
  )
}

/** frame is one chunked-encoding frame carrying one SSE data line. */
function frame(data: string): string {
  const line = `data: ${data}\n\n`
  return `${Buffer.byteLength(line).toString(16)}\r\n${line}\r\n`
}

/**
 * stream answers one completion. Request handling stays minimal (regex probes instead of
 * JSON.parse) and the frames are encoded once per request, so the stub allocates almost nothing
 * per token: its garbage-collection pauses would otherwise delay its arrival stamps.
 */
function stream(s: Socket<Conn>, id: string, body: string, arrived: number, chat: boolean): void {
  const maxTokens = Number(/"max_tokens"\s*:\s*(\d+)/.exec(body)?.[1] ?? 16)
  const includeUsage = usage && /"include_usage"\s*:\s*true/.test(body)
  const record: StubRecord = {
    ttft_ms: -1,
    chunks: 0,
    arrived_epoch: performance.timeOrigin + arrived,
    first_sent_epoch: 0,
  }
  records.set(id, record)
  const choice = (finish: string) =>
    chat
      ? `{"index":0,"delta":{"content":" tok"},"finish_reason":${finish}}`
      : `{"index":0,"text":" tok","finish_reason":${finish}}`
  const token = (finish: string) =>
    frame(`{"id":"${id}","object":"text_completion","choices":[${choice(finish)}]}`)
  const middle = encoder.encode(token('null'))
  const first = encoder.encode(STREAM_HEAD + (maxTokens === 1 ? token('"length"') : token('null')))
  const interval = 1000 / tokensPerSec
  const start = performance.now()
  const delay = ttftMs + Math.random() * ttftJitterMs
  let sent = 0
  const tick = () => {
    const conn = s.data
    if (!conn.open) return
    const last = sent + 1 === maxTokens
    if (sent === 0) {
      send(s, first)
      const now = performance.now()
      record.ttft_ms = now - arrived
      record.first_sent_epoch = performance.timeOrigin + now
    } else send(s, last ? token('"length"') : middle)
    sent++
    record.chunks = sent
    if (last) {
      let tail = ''
      if (includeUsage) {
        const prompt = (JSON.parse(body) as { prompt?: unknown }).prompt
        const promptTokens = wordCount(typeof prompt === 'string' ? prompt : '') + bos
        const u = { prompt_tokens: promptTokens, completion_tokens: sent, total_tokens: promptTokens + sent }
        tail += frame(`{"id":"${id}","choices":[],"usage":${JSON.stringify(u)}}`)
      }
      send(s, `${tail}${frame('[DONE]')}0\r\n\r\n`)
      conn.timer = undefined
      return
    }
    conn.timer = setTimeout(tick, Math.max(0, start + delay + sent * interval - performance.now()))
  }
  s.data.timer = setTimeout(tick, delay)
}

const STREAM_HEAD =
  'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n'

function handle(s: Socket<Conn>, head: string, body: string, arrived: number): void {
  const lineEnd = head.indexOf('\r\n')
  const [method, path] = head.slice(0, lineEnd < 0 ? head.length : lineEnd).split(' ')
  if (path === '/health') {
    reply(s, 200, 'ok', 'text/plain')
    return
  }
  if (path === '/stats') {
    reply(s, 200, JSON.stringify(Object.fromEntries(records)))
    return
  }
  if (path === '/stats/reset' && method === 'POST') {
    records.clear()
    reply(s, 200, '{"ok":true}')
    return
  }
  if (path === '/tokenize' && method === 'POST' && tokenize) {
    const count = wordCount((JSON.parse(body) as { prompt?: string }).prompt ?? '') + bos
    reply(s, 200, JSON.stringify({ count, max_model_len: maxModelLen, tokens: [] }))
    return
  }
  if ((path === '/v1/completions' || path === '/v1/chat/completions') && method === 'POST') {
    completions++
    if (failEvery > 0 && completions % failEvery === 0) {
      reply(s, 500, '{"error":{"message":"injected failure","type":"server_error","code":500}}')
      return
    }
    const id = /\r\nx-request-id:\s*([^\r]+)/i.exec(head)?.[1] ?? `req-${completions}`
    stream(s, id, body, arrived, path.includes('chat'))
    return
  }
  reply(s, 404, '{"error":{"message":"not found"}}')
}

const queue: { s: Socket<Conn>; text: string; at: number }[] = []

/** flushQueue handles one queued read per loop turn, so arrivals keep being stamped during a burst. */
function flushQueue(): void {
  const item = queue.shift()
  if (item?.s.data.open) receive(item.s, item.text, item.at)
  if (queue.length > 0) setImmediate(flushQueue)
}

function receive(s: Socket<Conn>, text: string, now: number): void {
  const c = s.data
  if (c.buf === '') c.arrived = now
  c.buf += text
  for (;;) {
    const end = c.buf.indexOf('\r\n\r\n')
    if (end < 0) return
    const head = c.buf.slice(0, end)
    const m = /content-length:\s*(\d+)/i.exec(head)
    const length = m ? Number(m[1]) : 0
    if (c.buf.length < end + 4 + length) return
    const body = Buffer.from(c.buf.slice(end + 4, end + 4 + length), 'latin1').toString('utf8')
    c.buf = c.buf.slice(end + 4 + length)
    handle(s, head, body, c.arrived)
    c.arrived = now
  }
}

const server = Bun.listen<Conn>({
  hostname: '127.0.0.1',
  port,
  socket: {
    open(s) {
      s.data = { out: [], buf: '', arrived: 0, timer: undefined, open: true }
      s.setNoDelay(true)
    },
    data(s, data) {
      // stamp now, parse after the event loop has delivered the whole batch (see the runner's Inbox)
      if (queue.push({ s, text: data.toString('latin1'), at: performance.now() }) === 1)
        setImmediate(flushQueue)
    },
    drain(s) {
      const rest = s.data.out
      s.data.out = []
      for (const bytes of rest) send(s, bytes)
    },
    close(s) {
      s.data.open = false
      if (s.data.timer) clearTimeout(s.data.timer)
    },
  },
})
console.log(`READY ${server.port}`)
