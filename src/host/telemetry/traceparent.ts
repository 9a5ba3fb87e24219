/**
 * W3C Trace Context `traceparent` (https://www.w3.org/TR/trace-context/): `00-<trace id>-<parent
 * id>-<flags>`, lower-case hex, 32 and 16 digits, neither all zeros. Parsed here rather than through
 * the OpenTelemetry propagator so the request path reads one header value with no carrier object.
 * A version other than 00 is read by its first four fields, as the spec asks of future versions.
 */
export interface TraceParent {
  traceId: string
  spanId: string
  /** the trace flags byte; bit 0 is `sampled`. */
  flags: number
}

const HEX = /^[0-9a-f]+$/
const ZEROS_32 = '0'.repeat(32)
const ZEROS_16 = '0'.repeat(16)

/** parseTraceparent: the header's fields, or null for anything malformed (then the trace starts here). */
export function parseTraceparent(value: string | null | undefined): TraceParent | null {
  if (!value || value.length < 55) return null
  const v = value.trim()
  const version = v.slice(0, 2)
  // Version ff is forbidden; version 00 has exactly four fields; later versions may add fields after a dash.
  if (version === 'ff' || !HEX.test(version)) return null
  if (version === '00' ? v.length !== 55 : v.length > 55 && v[55] !== '-') return null
  if (v[2] !== '-' || v[35] !== '-' || v[52] !== '-') return null
  const traceId = v.slice(3, 35)
  const spanId = v.slice(36, 52)
  const flags = v.slice(53, 55)
  if (!HEX.test(traceId) || !HEX.test(spanId) || !HEX.test(flags)) return null
  if (traceId === ZEROS_32 || spanId === ZEROS_16) return null
  return { traceId, spanId, flags: Number.parseInt(flags, 16) }
}

/** formatTraceparent: the header value that makes `spanId` the parent of whatever receives it. */
export function formatTraceparent(traceId: string, spanId: string, flags: number): string {
  // The two flags modelgate sends are written as they are (no number formatting per request).
  const f = flags === 1 ? '01' : flags === 0 ? '00' : (flags & 0xff).toString(16).padStart(2, '0')
  return `00-${traceId}-${spanId}-${f}`
}
