/**
 * The HTTP/1.1 field syntax (RFC 9110 §5, RFC 9112 §5) both parsers check heads against: the
 * client's requests (src/wire/request-parser.ts) and the engines' responses (response-parser.ts).
 * One definition, so a request head and a response head are held to the same rules.
 */

/**
 * FIELD_LINES checks every field line of a head in one test of the whole block (cheaper than one
 * per line): set lastIndex to the end of the start line (the CRLF before the first field line) and
 * test the head text without its final CRLFCRLF. Each line is CRLF, a token, ':' at once, and a
 * value with no control but HTAB. That refuses obs-fold, whitespace before the colon, NUL, DEL, and
 * any bare CR or LF. Bytes >= 0x80 pass (obs-text). Sticky: callers set lastIndex before each test.
 */
export const FIELD_LINES = /(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*)*$/y

/** TCHAR[b] is 1 when byte b is a token character (RFC 9110 §5.6.2), for byte-level scans. */
export const TCHAR: Uint8Array = (() => {
  const table = new Uint8Array(256)
  const tchar = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]$/
  for (let b = 0; b < 128; b++) if (tchar.test(String.fromCharCode(b))) table[b] = 1
  return table
})()

/** DIGITS: a Content-Length value as both parsers accept it (no sign, no spaces, no list). */
export const DIGITS = /^\d+$/

export const CR = 13
export const LF = 10

/** isOws: SP or HTAB, the optional whitespace around a field value (not NBSP, a legal latin1 byte). */
export function isOws(c: number): boolean {
  return c === 32 || c === 9
}

/** hexValue: 0-15 for an ASCII hex digit, -1 otherwise. */
export function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48
  if (c >= 97 && c <= 102) return c - 87
  if (c >= 65 && c <= 70) return c - 55
  return -1
}

/**
 * bareLf: buf[from, to) holds an LF not preceded by CR (buf[head] is the first byte of the head, so
 * an LF there is bare whatever came before it). A head whose lines end in bare LF never shows
 * CRLFCRLF: both parsers refuse it as soon as it arrives, scanning only the bytes new to them.
 */
export function bareLf(buf: Buffer, head: number, from: number, to: number): boolean {
  for (let i = buf.indexOf(LF, from); i >= 0 && i < to; i = buf.indexOf(LF, i + 1))
    if (i === head || buf[i - 1] !== CR) return true
  return false
}
