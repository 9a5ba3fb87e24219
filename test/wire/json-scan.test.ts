import { describe, expect, it } from 'bun:test'
import { scanJson } from '../../src/wire/json-scan.ts'

const scan = (text: string, depth = 64) => {
  const buf = Buffer.from(text)
  return scanJson(buf, 0, buf.length, depth)
}

/** verdict: what the scan says of a text, in JSON.parse's terms. */
function verdict(text: string): 'invalid' | 'not_object' | 'object' {
  const r = scan(text, 1000)
  return typeof r === 'string' ? (r === 'too_deep' ? 'invalid' : r) : 'object'
}

function parseVerdict(text: string): 'invalid' | 'not_object' | 'object' {
  let v: unknown
  try {
    v = JSON.parse(text)
  } catch {
    return 'invalid'
  }
  return v !== null && typeof v === 'object' && !Array.isArray(v) ? 'object' : 'not_object'
}

describe('scanJson', () => {
  it('reads the top-level model, max_tokens and stream, and nothing nested', () => {
    const r = scan(
      '{"messages":[{"model":"inner","stream":false}],"model":"a/b","max_tokens":16,"stream":true,"x":{"model":"y"}}',
    )
    if (typeof r === 'string') throw new Error(r)
    expect(r.string('model')).toBe('a/b')
    expect(r.value('max_tokens')).toBe(16)
    expect(r.value('stream')).toBe(true)
  })

  it('keeps the last of duplicate keys and reads escaped spellings of a key and its value', () => {
    const r = scan('{"model":"a","mod\\u0065l":"b\\"c\\u00e9"}')
    if (typeof r === 'string') throw new Error(r)
    expect(r.string('model')).toBe('b"cé')
  })

  it('records a container value of a recorded key whole, and a non-string model as no string', () => {
    const r = scan('{"max_tokens":[1,[2]],"model":{"a":1}}')
    if (typeof r === 'string') throw new Error(r)
    expect(r.value('max_tokens')).toEqual([1, [2]])
    expect(r.string('model')).toBeUndefined()
    expect(r.has('model')).toBe(true)
    expect(r.has('stream')).toBe(false)
  })

  it('refuses nesting deeper than the limit where it starts, and accepts the limit itself', () => {
    expect(scan(`{"a":${'['.repeat(63)}${']'.repeat(63)}}`, 64)).not.toBeString()
    expect(scan(`{"a":${'['.repeat(64)}${']'.repeat(64)}}`, 64)).toBe('too_deep')
    // A deep body that is cut short is refused as too deep, not read to its end.
    expect(scan(`{"a":${'['.repeat(5_000_000)}`, 64)).toBe('too_deep')
  })

  it('skips a UTF-8 byte-order mark as the engine does', () => {
    expect(scan('\ufeff{"model":"m"}')).not.toBeString()
  })

  it.each([
    '{}',
    ' {"a" : 1 } ',
    '{"a":[]}',
    '{"a":[1,2.5,-0,1e5,1E-5,-1.25e+3,true,false,null,"s",{}]}',
    '{"a":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041"}',
    '[1]',
    '"x"',
    '12',
    'null',
    '',
    ' ',
    '{',
    '}',
    '{"a":}',
    '{"a" 1}',
    '{"a":1,}',
    '{,}',
    '[1,]',
    '[,1]',
    '{"a":1}}',
    '{"a":1} x',
    '{"a":1}{}',
    '{a:1}',
    "{'a':1}",
    '{"a":01}',
    '{"a":1.}',
    '{"a":.5}',
    '{"a":-}',
    '{"a":1e}',
    '{"a":+1}',
    '{"a":tru}',
    '{"a":nul}',
    '{"a":True}',
    '{"a":"\\x"}',
    '{"a":"\\u12"}',
    '{"a":"\\u12G4"}',
    '{"a":"tab\there"}',
    '{"a":"nl\nhere"}',
    '{"a":"unterminated}',
    '{"a":[}',
    '{"a":{]}',
    '{"a":NaN}',
    '{"a":Infinity}',
    '{"a":1\u00a0}',
  ])('agrees with JSON.parse on %p', (text) => {
    expect(verdict(text)).toBe(parseVerdict(text))
  })

  it('agrees with JSON.parse on 20,000 random mutations of an inference body', () => {
    const base =
      '{"model":"m","messages":[{"role":"user","content":"hi \\"there\\" \\u00e9"}],"max_tokens":16,"temperature":0.5,"stream":true,"stop":null,"x":[true,false,{"y":-1.5e3}]}'
    const alphabet = '{}[]",:\\ 0123456789-+.eEtrufalsn\u00e9\n'
    let seed = 12345
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff
      return seed % n
    }
    let disagreements = 0
    for (let k = 0; k < 20_000; k++) {
      const chars = [...base]
      for (let m = 1 + rand(3); m > 0; m--) {
        const at = rand(chars.length + 1)
        const op = rand(3)
        const c = alphabet[rand(alphabet.length)]!
        if (op === 0) chars.splice(at, 0, c)
        else if (op === 1) chars.splice(at, 1)
        else chars[at] = c
      }
      const text = chars.join('')
      if (verdict(text) !== parseVerdict(text)) disagreements++
      const r = scan(text, 1000)
      if (typeof r !== 'string') {
        const parsed = JSON.parse(text) as Record<string, unknown>
        const model = typeof parsed.model === 'string' ? parsed.model : undefined
        if (r.string('model') !== model) disagreements++
      }
    }
    expect(disagreements).toBe(0)
  })
})
