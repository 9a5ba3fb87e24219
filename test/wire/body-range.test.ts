import { describe, expect, test } from 'bun:test'
import { BodyRange } from '../../src/wire/body-range.ts'
import { RequestParser } from '../../src/wire/request-parser.ts'

describe('BodyRange', () => {
  const buf = Buffer.from('HEAD{"a":1}NEXT', 'latin1')
  const body = BodyRange.of(buf, 4, 11)

  test('reads, copies and views only its own bytes', () => {
    expect(body.length).toBe(7)
    expect(body.text()).toBe('{"a":1}')
    const out = Buffer.alloc(10, 0x2e)
    expect(body.copyTo(out, 2)).toBe(7)
    expect(out.toString('latin1')).toBe('..{"a":1}.')
    const view = body.bytes()
    expect([view.buffer, view.byteOffset, view.byteLength]).toEqual([buf.buffer, buf.byteOffset + 4, 7])
  })

  test('refuses bounds outside the buffer', () => {
    expect(() => BodyRange.of(buf, 5, 4)).toThrow(RangeError)
    expect(() => BodyRange.of(buf, -1, 2)).toThrow(RangeError)
    expect(() => BodyRange.of(buf, 0, buf.length + 1)).toThrow(RangeError)
  })

  test('from() wraps a whole array without a copy; bytes() gives that array back', () => {
    const u8 = new TextEncoder().encode('{"model":"m"}')
    const r = BodyRange.from(u8)
    expect(r.length).toBe(u8.length)
    expect(r.bytes().buffer).toBe(u8.buffer)
    expect(BodyRange.EMPTY.length).toBe(0)
    expect(BodyRange.EMPTY.text()).toBe('')
  })

  test('text() decodes UTF-8 as TextDecoder does: a leading BOM skipped, bad bytes replaced', () => {
    const samples = [
      [0xef, 0xbb, 0xbf, ...Buffer.from('{"model":"é"}')],
      [...Buffer.from('"x'), 0xff, 0xc3, ...Buffer.from('"')],
      [0xef, 0xbb],
      [...Buffer.from('\ufeff\ufeff{}')],
    ]
    for (const bytes of samples) {
      const padded = Buffer.from([0x41, ...bytes, 0x42])
      expect(BodyRange.of(padded, 1, padded.length - 1).text()).toBe(
        new TextDecoder().decode(new Uint8Array(bytes)),
      )
    }
  })

  test('a pipelined request after a body is not part of it', () => {
    const p = new RequestParser()
    const next = 'GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n'
    p.push(Buffer.from(`POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok${next}`, 'latin1'))
    const r = p.next()!
    const out = Buffer.alloc(64)
    expect(r.body.copyTo(out, 0)).toBe(2)
    expect(r.body.text()).toBe('ok')
    expect(p.next()!.head.path).toBe('/v1/models')
  })
})
