/**
 * router-bench-engine is the upstream of the router benchmark: a minimal OpenAI-compatible engine
 * (Bun.serve) that answers at once, so the figures measure the proxies, not the engine. Non-stream
 * requests get a ~350-byte chat.completion; `stream: true` gets `--chunks` SSE chunks and [DONE].
 * Prints `READY <port>`.
 *
 *   bun test/perf/router-bench-engine.ts [--port 0] [--chunks 16]
 */
const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? Number(args[i + 1]) : fallback
}
const chunks = flag('chunks', 16)

const reply = JSON.stringify({
  id: 'chatcmpl-bench',
  object: 'chat.completion',
  created: 1_700_000_000,
  model: 'bench-model',
  choices: [
    {
      index: 0,
      message: { role: 'assistant', content: 'Hello from the bench engine.' },
      finish_reason: 'stop',
    },
  ],
  usage: { prompt_tokens: 5, completion_tokens: 7, total_tokens: 12 },
})
const encoder = new TextEncoder()
const frame = (i: number) =>
  encoder.encode(
    `data: ${JSON.stringify({
      id: 'chatcmpl-bench',
      object: 'chat.completion.chunk',
      created: 1_700_000_000,
      model: 'bench-model',
      choices: [
        { index: 0, delta: { content: `tok${i} ` }, finish_reason: i === chunks - 1 ? 'stop' : null },
      ],
    })}\n\n`,
  )
const chunkFrames = Array.from({ length: chunks }, (_, i) => frame(i))
const done = encoder.encode('data: [DONE]\n\n')

const server = Bun.serve({
  hostname: '127.0.0.1',
  port: flag('port', 0),
  idleTimeout: 0,
  async fetch(req) {
    if (req.method !== 'POST') return new Response(null, { status: 404 })
    const body = (await req.json()) as { stream?: boolean }
    if (!body.stream) return new Response(reply, { headers: { 'content-type': 'application/json' } })
    let i = 0
    return new Response(
      new ReadableStream<Uint8Array>({
        pull(c) {
          if (i < chunkFrames.length) c.enqueue(chunkFrames[i++]!)
          else {
            c.enqueue(done)
            c.close()
          }
        },
      }),
      { headers: { 'content-type': 'text/event-stream' } },
    )
  },
})
console.log(`READY ${server.port}`)
