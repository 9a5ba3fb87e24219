import { STATUS_CODES } from 'node:http'
import type { AppError, ErrorShape } from '../http/errors.ts'

/** Response heads and the small complete responses the wire front writes itself. */
const NON_ASCII = /[^\x00-\x7f]/

/** latin1 turns header text (bytes as received, one char each) into bytes when it is not ASCII. */
export function latin1(text: string): Uint8Array | string {
  return NON_ASCII.test(text) ? Buffer.from(text, 'latin1') : text
}

const statusLines = new Map<number, string>()
export function statusLine(status: number): string {
  let line = statusLines.get(status)
  if (line === undefined) {
    line = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n`
    statusLines.set(status, line)
  }
  return line
}

let dateLine = ''
let dateSecond = 0
/** dateHeader: the Date header of the front's own responses, formatted once per second. */
export function dateHeader(): string {
  const now = Date.now()
  const second = Math.floor(now / 1000)
  if (second !== dateSecond) {
    dateSecond = second
    dateLine = `date: ${new Date(now).toUTCString()}\r\n`
  }
  return dateLine
}

/**
 * jsonResponse: a complete response with a JSON body; `headers` are extra header lines, and so is
 * `extraHead` (lines already written, each ending CRLF: a grant's rate-limit state).
 */
export function jsonResponse(
  status: number,
  value: unknown,
  keepAlive: boolean,
  headers: Record<string, string> = {},
  extraHead = '',
): Uint8Array {
  const body = Buffer.from(JSON.stringify(value))
  let head = `${statusLine(status)}${dateHeader()}content-type: application/json\r\n${extraHead}`
  for (const name in headers) head += `${name}: ${headers[name]}\r\n`
  head += `content-length: ${body.byteLength}\r\n${keepAlive ? '' : 'connection: close\r\n'}\r\n`
  const out = Buffer.allocUnsafe(Buffer.byteLength(head, 'latin1') + body.byteLength)
  const n = out.write(head, 0, 'latin1')
  out.set(body, n)
  return out
}

/** errorResponse: an AppError as a complete response in the given shape (Retry-After and the like kept). */
export function errorResponse(
  error: AppError,
  shape: ErrorShape,
  keepAlive: boolean,
  extraHead = '',
): Uint8Array {
  return jsonResponse(error.statusIn(shape), error.bodyIn(shape), keepAlive, error.headers, extraHead)
}
