import { describe, expect, it } from 'bun:test'
import { BodyRange } from '../../src/wire/body-range.ts'
import type { ScannedJson } from '../../src/wire/json-scan.ts'
import { askForUsage, finishReasons, readUsage, UsageStream } from '../../src/wire/usage.ts'

const buf = (s: string) => Buffer.from(s)
const read = (s: string) => readUsage(buf(s), 0, Buffer.byteLength(s))

function scanned(text: string, prefix = ''): { body: BodyRange; json: ScannedJson } {
  // The body sits inside a larger buffer (as a socket read holds it), after `prefix`.
  const b = Buffer.from(prefix + text + 'POST /next HTTP/1.1\r\n')
  const body = BodyRange.of(b, prefix.length, prefix.length + Buffer.byteLength(text))
  const json = body.scanJson(64)
  if (typeof json === 'string') throw new Error(json)
  return { body, json }
}

describe('readUsage', () => {
  it('reads the top-level usage of an engine reply, nested details and spaces included', () => {
    expect(
      read(
        '{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}',
      ),
    ).toEqual({ prompt: 12, completion: 8 })
    expect(read('{"usage" : { "prompt_tokens" : 3 , "completion_tokens" : 1 } }')).toEqual({
      prompt: 3,
      completion: 1,
    })
  })

  it('is not fooled by "usage" inside a string, a null usage, or counts that are not counts', () => {
    expect(
      read('{"choices":[{"message":{"content":"say \\"usage\\": {\\"prompt_tokens\\": 9}"}}]}'),
    ).toBeNull()
    expect(read('{"usage":null}')).toBeNull()
    expect(read('{"usage":{"prompt_tokens":-1,"completion_tokens":2}}')).toBeNull()
    expect(read('{"usage":{"prompt_tokens":"5"}}')).toBeNull()
    // The object's own counts, not a nested object's of the same name, in whatever order.
    expect(
      read(
        '{"usage":{"details":{"prompt_tokens":99,"completion_tokens":98},"completion_tokens":2,"prompt_tokens":5}}',
      ),
    ).toEqual({ prompt: 5, completion: 2 })
    expect(read('{"usage":{"prompt_tokens":5,"completion_tokens":2')).toBeNull()
    // An embeddings reply: prompt tokens only.
    expect(read('{"data":[],"usage":{"prompt_tokens":7,"total_tokens":7}}')).toEqual({
      prompt: 7,
      completion: 0,
    })
  })

  it('reads only within its range', () => {
    const text = 'xx{"usage":{"prompt_tokens":2,"completion_tokens":3}}yy'
    expect(readUsage(buf(text), 2, text.length - 2)).toEqual({ prompt: 2, completion: 3 })
    expect(readUsage(buf(text), 2, 20)).toBeNull()
  })
})

describe('askForUsage', () => {
  it('leaves a request that is not streamed alone', () => {
    const { body, json } = scanned('{"model":"m","stream":false}')
    expect(askForUsage(body, json).body).toBe(body)
  })

  it('adds stream_options after stream, every other byte kept, and says to strip', () => {
    const text = '{ "model" : "m", "stream":true , "messages":[] }'
    const { body, json } = scanned(text, 'HEAD')
    const asked = askForUsage(body, json)
    expect(asked.strip).toBe(true)
    expect(asked.body.text()).toBe(
      '{ "model" : "m", "stream":true,"stream_options":{"include_usage":true} , "messages":[] }',
    )
    // The moved scan still finds every field in the new bytes.
    expect(asked.json.string('model')).toBe('m')
    expect(asked.json.value('stream_options')).toEqual({ include_usage: true })
    expect(JSON.parse(asked.body.text())).toEqual({
      ...JSON.parse(text),
      stream_options: { include_usage: true },
    })
  })

  it('sets include_usage in the client’s own stream_options, keeps its other options, and strips', () => {
    const { body, json } = scanned(
      '{"stream_options":{"continuous_usage_stats":true},"stream":true,"model":"m"}',
    )
    const asked = askForUsage(body, json)
    expect(asked.strip).toBe(true)
    expect(JSON.parse(asked.body.text())).toEqual({
      stream_options: { continuous_usage_stats: true, include_usage: true },
      stream: true,
      model: 'm',
    })
    expect(asked.json.string('model')).toBe('m')
  })

  it('keeps the usage chunk for a client that asked, and leaves a stream_options that is not an object', () => {
    const a = scanned('{"stream":true,"stream_options":{"include_usage":true},"model":"m"}')
    expect(askForUsage(a.body, a.json)).toEqual({ ...a, strip: false })
    const b = scanned('{"stream":true,"stream_options":"yes","model":"m"}')
    expect(askForUsage(b.body, b.json).body).toBe(b.body)
    const c = scanned('{"stream":true,"stream_options":null,"model":"m"}')
    expect(JSON.parse(askForUsage(c.body, c.json).body.text()).stream_options).toEqual({
      include_usage: true,
    })
  })
})

const event = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`
const TOKEN = event({ id: 'c', choices: [{ index: 0, delta: { content: 'hi' } }] })
const USAGE = event({
  id: 'c',
  choices: [],
  usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 },
})
const DONE = 'data: [DONE]\n\n'

/** through: what the client receives when `pieces` go through a UsageStream, piece by piece (null: unchanged). */
function through(s: UsageStream, pieces: string[]): (string | null)[] {
  return pieces.map((p) => {
    const out = s.feed(buf(p), 0, Buffer.byteLength(p))
    return out === null ? null : Buffer.from(out).toString()
  })
}

describe('UsageStream', () => {
  it('reads the usage chunk and passes every piece as it is', () => {
    const s = new UsageStream(false)
    expect(through(s, [TOKEN, TOKEN, USAGE, DONE])).toEqual([null, null, null, null])
    expect(s.usage).toEqual({ prompt: 4, completion: 2 })
  })

  it('strips the usage chunk alone, piece for piece otherwise', () => {
    const s = new UsageStream(true)
    expect(through(s, [TOKEN, TOKEN, USAGE, DONE])).toEqual([null, null, '', null])
    expect(s.usage).toEqual({ prompt: 4, completion: 2 })
    const t = new UsageStream(true)
    expect(through(t, [TOKEN + USAGE + DONE])).toEqual([TOKEN + DONE])
    expect(t.rest()).toBeNull()
  })

  it('holds an event split across pieces until it is whole, then sends it with the next piece', () => {
    const s = new UsageStream(true)
    const cut = USAGE.length - 20
    expect(through(s, [TOKEN + USAGE.slice(0, cut), USAGE.slice(cut) + DONE])).toEqual([TOKEN, DONE])
    expect(s.usage).toEqual({ prompt: 4, completion: 2 })
    const r = new UsageStream(false)
    expect(through(r, [TOKEN.slice(0, 10), TOKEN.slice(10) + USAGE.slice(0, 30), USAGE.slice(30)])).toEqual([
      null,
      null,
      null,
    ])
    expect(r.usage).toEqual({ prompt: 4, completion: 2 })
  })

  it('leaves token chunks that carry usage (continuous usage) in the stream', () => {
    const s = new UsageStream(true)
    const withUsage = event({
      choices: [{ delta: { content: 'x' } }],
      usage: { prompt_tokens: 4, completion_tokens: 1 },
    })
    expect(through(s, [withUsage, USAGE, DONE])).toEqual([null, '', null])
    expect(s.usage).toEqual({ prompt: 4, completion: 2 })
  })

  it('reads CRLF-framed events too', () => {
    const s = new UsageStream(true)
    const crlf = USAGE.replace(/\n\n$/, '\r\n\r\n')
    expect(through(s, [TOKEN, crlf, DONE])).toEqual([null, '', null])
  })

  it('stops stripping, sending everything, when an event grows past what it may hold', () => {
    const s = new UsageStream(true)
    const huge = `data: ${'x'.repeat(70 * 1024)}`
    const out = through(s, [huge])
    expect(out[0]).toBe(huge)
    expect(s.strip).toBe(false)
    expect(through(s, ['\n\n', USAGE])).toEqual([null, null])
  })

  it('gives back an unfinished last event at the end', () => {
    const s = new UsageStream(true)
    expect(through(s, [TOKEN, 'data: {"cut'])).toEqual([null, ''])
    expect(Buffer.from(s.rest()!).toString()).toBe('data: {"cut')
  })
})

describe("finish reasons (for a traced request's span)", () => {
  const chatJson = JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    model: 'm',
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: 'a "finish_reason": "evil" and "usage": {"prompt_tokens": 999}',
        },
        finish_reason: 'stop',
      },
      { index: 1, message: { role: 'assistant', content: 'x' }, finish_reason: 'length', stop_reason: null },
    ],
    usage: { prompt_tokens: 12, total_tokens: 46, completion_tokens: 34 },
  })

  it('reads every choice finish reason of a JSON answer, never text that looks like one', () => {
    expect(finishReasons(buf(chatJson), 0, Buffer.byteLength(chatJson))).toEqual(['stop', 'length'])
    expect(read(chatJson)).toEqual({ prompt: 12, completion: 34 })
    expect(finishReasons(buf('{"finish_reason" : "tool_calls"}'), 0, 32)).toEqual(['tool_calls'])
    expect(finishReasons(buf('{"finish_reason": null}'), 0, 23)).toEqual([])
  })

  it("collects a stream's finish reasons as its pieces pass, however they are cut", () => {
    const frames = [
      { choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: null }] },
      { choices: [{ index: 0, delta: { content: '!' }, finish_reason: 'stop' }] },
      { choices: [], usage: { prompt_tokens: 5, total_tokens: 7, completion_tokens: 2 } },
    ]
    const all = Buffer.from(`${frames.map((f) => `data: ${JSON.stringify(f)}\n\n`).join('')}data: [DONE]\n\n`)
    for (const piece of [1, 7, 50, all.length]) {
      const s = new UsageStream(false, true)
      for (let at = 0; at < all.length; at += piece) {
        const padded = Buffer.concat([buf('xx'), all.subarray(at, at + piece), buf('yy')])
        expect(s.feed(padded, 2, padded.length - 2)).toBeNull()
      }
      expect(s.reasons).toEqual(['stop'])
      expect(s.usage).toEqual({ prompt: 5, completion: 2 })
    }
    expect(new UsageStream(false).reasons).toBeNull()
  })
})

/** One named SSE event, as the Responses and Messages APIs write them. */
const named = (type: string, data: unknown) => `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`

describe('the Responses and Messages APIs (input_tokens, output_tokens)', () => {
  it("reads a Responses reply's usage and a Messages reply's", () => {
    expect(
      read(
        JSON.stringify({
          object: 'response',
          output: [{ type: 'message', content: [{ type: 'output_text', text: 'usage' }] }],
          usage: {
            input_tokens: 11,
            input_tokens_details: { cached_tokens: 3 },
            output_tokens: 7,
            output_tokens_details: { reasoning_tokens: 0 },
            total_tokens: 18,
          },
        }),
      ),
    ).toEqual({ prompt: 11, completion: 7 })
    expect(
      read(
        JSON.stringify({
          type: 'message',
          content: [{ type: 'text', text: 'hi' }],
          usage: { input_tokens: 9, cache_read_input_tokens: 4, output_tokens: 2 },
        }),
      ),
    ).toEqual({ prompt: 9, completion: 2 })
    // An output count alone is no reply's usage.
    expect(read('{"usage":{"output_tokens":3}}')).toBeNull()
  })

  it("reads a Responses stream's usage from response.completed (response.created's is null)", () => {
    const s = new UsageStream(false)
    const created = named('response.created', { type: 'response.created', response: { usage: null } })
    const delta = named('response.output_text.delta', { type: 'response.output_text.delta', delta: 'x' })
    const completed = named('response.completed', {
      type: 'response.completed',
      response: { status: 'completed', usage: { input_tokens: 5, output_tokens: 2, total_tokens: 7 } },
    })
    expect(through(s, [created, delta, delta, completed])).toEqual([null, null, null, null])
    expect(s.usage).toEqual({ prompt: 5, completion: 2 })
  })

  it("takes a Messages stream's input from message_start and its output from the last message_delta", () => {
    const s = new UsageStream(true)
    const start = named('message_start', {
      type: 'message_start',
      message: { type: 'message', usage: { input_tokens: 12, output_tokens: 1 } },
    })
    const delta = named('content_block_delta', {
      type: 'content_block_delta',
      delta: { type: 'text_delta', text: 'x' },
    })
    const end = named('message_delta', {
      type: 'message_delta',
      delta: { stop_reason: 'end_turn' },
      usage: { output_tokens: 6 },
    })
    const stop = named('message_stop', { type: 'message_stop' })
    // Nothing of these streams is taken out, even when stripping was asked.
    expect(through(s, [start, delta, end, stop])).toEqual([null, null, null, null])
    expect(s.usage).toEqual({ prompt: 12, completion: 6 })
    // Newer builds repeat the input count in message_delta: it is taken as given.
    const t = new UsageStream(false)
    through(t, [start, end.replace('"output_tokens":6', '"input_tokens":13,"output_tokens":6')])
    expect(t.usage).toEqual({ prompt: 13, completion: 6 })
  })
})
