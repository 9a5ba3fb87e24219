import { describe, expect, it } from 'bun:test'
import { ResponseTail, readUsage, TAIL_BYTES } from '../../src/wire/usage.ts'

/** What a traced request's span reads of an engine's answer (src/wire/usage.ts), on vLLM's shapes. */
const enc = (s: string) => Buffer.from(s, 'utf8')

const chatJson = JSON.stringify({
  id: 'chatcmpl-1',
  object: 'chat.completion',
  model: 'm',
  choices: [
    {
      index: 0,
      message: { role: 'assistant', content: 'a "usage": {"prompt_tokens": 999}' },
      finish_reason: 'stop',
    },
    { index: 1, message: { role: 'assistant', content: 'x' }, finish_reason: 'length', stop_reason: null },
  ],
  usage: {
    prompt_tokens: 12,
    total_tokens: 46,
    completion_tokens: 34,
    prompt_tokens_details: { cached_tokens: 3 },
    completion_tokens_details: { reasoning_tokens: 1 },
  },
})

function sse(frames: unknown[]): string {
  return `${frames.map((f) => `data: ${JSON.stringify(f)}\n\n`).join('')}data: [DONE]\n\n`
}

describe('readUsage', () => {
  it('reads the counts and every choice finish reason of a JSON answer, never text that looks like them', () => {
    expect(readUsage(enc(chatJson))).toEqual({
      inputTokens: 12,
      outputTokens: 34,
      finishReasons: ['stop', 'length'],
    })
  })

  it('reads the final usage chunk of a stream, past chunks that say usage: null', () => {
    const stream = sse([
      { choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: null }], usage: null },
      { choices: [{ index: 0, delta: { content: '!' }, finish_reason: 'stop' }], usage: null },
      { choices: [], usage: { prompt_tokens: 5, total_tokens: 7, completion_tokens: 2 } },
    ])
    expect(readUsage(enc(stream))).toEqual({ inputTokens: 5, outputTokens: 2, finishReasons: ['stop'] })
  })

  it('takes spaces around colons, and gives null when the answer says nothing of the kind', () => {
    expect(readUsage(enc('{"usage" : { "completion_tokens" : 3 }, "finish_reason" : "stop"}'))).toEqual({
      outputTokens: 3,
      finishReasons: ['stop'],
    })
    expect(readUsage(enc('{"data":[{"embedding":[0.1]}]}'))).toBeNull()
    expect(readUsage(enc('{"usage": null, "finish_reason": null}'))).toBeNull()
    expect(readUsage(new Uint8Array(0))).toBeNull()
  })
})

describe('ResponseTail', () => {
  it('keeps the last TAIL_BYTES of what passes, in order, however it is cut', () => {
    const text = Array.from({ length: 3000 }, (_, i) => `${i % 10}`).join('') + 'END'
    const all = Buffer.from(text)
    for (const piece of [1, 7, 100, 4095, 4096, 5000]) {
      const tail = new ResponseTail()
      // Pieces come as slices of larger buffers, as a parser hands them over.
      for (let at = 0; at < all.length; at += piece) {
        const padded = Buffer.concat([Buffer.from('xx'), all.subarray(at, at + piece), Buffer.from('yy')])
        tail.keep(padded, 2, padded.length - 2)
      }
      const want = all.subarray(Math.max(0, all.length - TAIL_BYTES))
      expect(Buffer.from(tail.bytes()).toString()).toBe(want.toString())
    }
    expect(new ResponseTail().bytes()).toHaveLength(0)
  })
})
