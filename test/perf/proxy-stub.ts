/**
 * proxy-stub is the benchmark's upstream engine: `POST /v1/chat/completions` answers a fixed chat
 * completion, or with `"stream": true` an SSE stream of 64 chunks 20 ms apart, ending with
 * `data: [DONE]` (after a usage chunk when the request asks for it, as vLLM does). Like an engine's batched decode steps, one ticker emits the next chunk of every
 * open stream at once; each chunk carries its send time `"t"` in wall-clock ms
 * (performance.timeOrigin + now(): sub-µs, consistent across processes), so a client in another
 * process can measure pass-through delay.
 * `POST /v1/responses` and `/v1/messages` answer in the Responses and Messages APIs' shapes (their
 * usage as `input_tokens`/`output_tokens`), so that a proxy reading each API's usage is measured on
 * its own bytes; with `--same-length` the three replies' texts are padded to one byte length (a
 * proxy's cost grows with the bytes it relays, which is not the API's doing). Their streams are the
 * chat stream (what is measured there is pass-through, whatever the events say).
 * Prints `{port, pid}` on stdout once listening.
 *
 *   bun test/perf/proxy-stub.ts [--chunks 64] [--interval-ms 20] [--same-length]
 */
import { numberArg } from './args.ts'

const CHUNKS = numberArg('--chunks', 64)
const INTERVAL_MS = numberArg('--interval-ms', 20)

const TEXT = 'A fixed answer from the stub engine.'
const chatReply = (text: string) =>
  JSON.stringify({
    id: 'chatcmpl-bench',
    object: 'chat.completion',
    created: 1_700_000_000,
    model: 'bench-model',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: text },
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 12, completion_tokens: 8, total_tokens: 20 },
  })
/** Each route's reply (the Responses and Messages APIs' as vLLM writes them, with the chat reply's counts). */
const SHAPES: Record<string, (text: string) => string> = {
  '/v1/chat/completions': chatReply,
  '/v1/responses': (text) =>
    JSON.stringify({
      id: 'resp_bench',
      object: 'response',
      created_at: 1_700_000_000,
      model: 'bench-model',
      status: 'completed',
      output: [
        {
          type: 'message',
          id: 'msg_bench',
          role: 'assistant',
          status: 'completed',
          content: [{ type: 'output_text', text, annotations: [] }],
        },
      ],
      usage: {
        input_tokens: 12,
        input_tokens_details: { cached_tokens: 0 },
        output_tokens: 8,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: 20,
      },
    }),
  '/v1/messages': (text) =>
    JSON.stringify({
      id: 'msg_bench',
      type: 'message',
      role: 'assistant',
      model: 'bench-model',
      content: [{ type: 'text', text }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage: { input_tokens: 12, output_tokens: 8 },
    }),
}
const longest = Math.max(...Object.values(SHAPES).map((shape) => shape(TEXT).length))
const REPLIES: Record<string, string> = Object.fromEntries(
  Object.entries(SHAPES).map(([path, shape]) => [
    path,
    shape(
      process.argv.includes('--same-length')
        ? TEXT.padEnd(TEXT.length + longest - shape(TEXT).length, '.')
        : TEXT,
    ),
  ]),
)
const REPLY = REPLIES['/v1/chat/completions']!
const encoder = new TextEncoder()
const DONE = encoder.encode('data: [DONE]\n\n')
/** The usage chunk before [DONE], for a stream that asks (`stream_options.include_usage`), as vLLM sends it. */
const USAGE = encoder.encode(
  'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench-model",' +
    '"choices":[],"usage":{"prompt_tokens":12,"total_tokens":76,"completion_tokens":64}}\n\n',
)
const PREFIX =
  'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench-model",' +
  '"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}],"t":'

interface Live {
  controller: ReadableStreamDefaultController<Uint8Array>
  sent: number
  usage: boolean
}
const live = new Set<Live>()

/** nowMs: wall-clock ms with sub-µs resolution, consistent across processes (unlike hrtime). */
export const nowMs = () => performance.timeOrigin + performance.now()

setInterval(() => {
  for (const s of live) {
    try {
      s.controller.enqueue(encoder.encode(`${PREFIX}${nowMs().toFixed(3)}}\n\n`))
      if (++s.sent === CHUNKS) {
        if (s.usage) s.controller.enqueue(USAGE)
        s.controller.enqueue(DONE)
        s.controller.close()
        live.delete(s)
      }
    } catch {
      live.delete(s)
    }
  }
}, INTERVAL_MS)

const server = Bun.serve({
  hostname: '127.0.0.1',
  port: 0,
  idleTimeout: 0,
  async fetch(req) {
    const body = await req.text()
    if (!body.includes('"stream":true'))
      return new Response(REPLIES[new URL(req.url).pathname] ?? REPLY, {
        headers: { 'content-type': 'application/json' },
      })
    let entry: Live | null = null
    const usage = /"include_usage"\s*:\s*true/.test(body)
    return new Response(
      new ReadableStream<Uint8Array>({
        start(controller) {
          entry = { controller, sent: 0, usage }
          live.add(entry)
        },
        cancel() {
          if (entry) live.delete(entry)
        },
      }),
      { headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' } },
    )
  },
})
process.stdout.write(`${JSON.stringify({ port: server.port, pid: process.pid })}\n`)
