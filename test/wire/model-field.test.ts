import { describe, expect, it } from 'bun:test'
import { BodyRange } from '../../src/wire/body-range.ts'
import { readModelField, replaceModel } from '../../src/wire/model-field.ts'

const enc = (s: string) => BodyRange.from(new TextEncoder().encode(s))
const dec = (b: BodyRange) => new TextDecoder().decode(b.bytes())

describe('model field', () => {
  it('reads the model of a JSON object', () => {
    expect(readModelField(enc('{"messages":[],"model":"a/b"}'))).toBe('a/b')
  })

  it.each([
    ['not JSON', '{"model":', 'invalid_json'],
    ['empty', '', 'invalid_json'],
    ['an array', '[{"model":"x"}]', 'invalid_request'],
    ['a string', '"x"', 'invalid_request'],
    ['no model', '{"prompt":"x"}', 'missing_model'],
    ['a null model', '{"model":null}', 'missing_model'],
  ])('refuses %s', (_name, body, code) => {
    const r = readModelField(enc(body))
    expect(typeof r).toBe('object')
    expect((r as { code: string }).code).toBe(code)
  })

  it('replaces only the top-level model value, every other byte kept', () => {
    const body =
      '{ "nested": {"model": "inner"}, "list": ["model", {"model":"x"}],\n "model" : "inst-1", "s": "\\"model\\": \\"no\\"" }'
    expect(dec(replaceModel(enc(body), 'served/name'))).toBe(
      '{ "nested": {"model": "inner"}, "list": ["model", {"model":"x"}],\n "model" : "served/name", "s": "\\"model\\": \\"no\\"" }',
    )
  })

  it('handles escapes in the old value and in the new one', () => {
    const out = replaceModel(enc('{"model":"a\\"b\\\\","x":1}'), 'q"u\\o✓')
    expect(JSON.parse(dec(out))).toEqual({ model: 'q"u\\o✓', x: 1 })
  })

  it('replaces the last of duplicate keys, the one JSON.parse reads', () => {
    const out = dec(replaceModel(enc('{"model":"a","model":"b"}'), 'c'))
    expect(out).toBe('{"model":"a","model":"c"}')
    expect(JSON.parse(out).model).toBe('c')
  })

  it('recognises an escaped spelling of the key', () => {
    expect(dec(replaceModel(enc('{"mod\\u0065l":"a"}'), 'c'))).toBe('{"mod\\u0065l":"c"}')
  })
})
