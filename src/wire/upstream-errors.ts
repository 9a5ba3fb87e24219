import { type AppError, proxyError } from '../http/errors.ts'
import { ProtocolError } from './response-parser.ts'

/**
 * The proxy's own failures, in the proxy (OpenAI-style) error shape. Types mirror the HTTP status
 * name the way a 503 is `service_unavailable`; codes say which deadline or failure hit.
 *
 * | status | type            | code                     | when                                           |
 * |--------|-----------------|--------------------------|------------------------------------------------|
 * | 502    | bad_gateway     | upstream_unavailable     | connection refused/reset before any response   |
 * | 502    | bad_gateway     | bad_gateway              | a reply head the proxy refuses to relay        |
 * | 502    | bad_gateway     | upstream_disconnected    | the engine went away in the middle of a stream |
 * | 504    | gateway_timeout | upstream_connect_timeout | no TCP connection within the connect deadline  |
 * | 504    | gateway_timeout | upstream_timeout         | no first byte within the first-byte deadline   |
 *
 * Messages never carry the engine's address: clients need not know the topology.
 */
export function upstreamUnavailable(cause: unknown): AppError {
  // The exchange answers any failure before the response with this.
  if (cause instanceof ProtocolError) return upstreamBadReply(cause)
  return proxyError(
    502,
    'bad_gateway',
    'upstream_unavailable',
    `The model engine is unavailable (${describeCause(cause)})`,
  )
}

/**
 * upstreamBadReply: the engine answered, but with a head that is not HTTP a proxy may relay (control
 * bytes or a malformed name in a field, obs-fold, a Transfer-Encoding other than chunked, both
 * framings…). The message names the flaw in the parser's words, never the engine's bytes.
 */
export function upstreamBadReply(cause: ProtocolError): AppError {
  return proxyError(
    502,
    'bad_gateway',
    'bad_gateway',
    `The model engine sent a malformed response (${cause.message})`,
  )
}

export function upstreamDisconnected(cause: unknown): AppError {
  return proxyError(
    502,
    'bad_gateway',
    'upstream_disconnected',
    `The model engine stopped before the response ended (${describeCause(cause)})`,
  )
}

export function upstreamTimeout(ms: number): AppError {
  return proxyError(
    504,
    'gateway_timeout',
    'upstream_timeout',
    `The model engine sent nothing within ${ms} ms`,
  )
}

export function upstreamConnectTimeout(ms: number): AppError {
  return proxyError(
    504,
    'gateway_timeout',
    'upstream_connect_timeout',
    `Could not connect to the model engine within ${ms} ms`,
  )
}

const CAUSES: Record<string, string> = {
  ECONNREFUSED: 'connection refused',
  ConnectionRefused: 'connection refused',
  ECONNRESET: 'connection reset',
  ConnectionClosed: 'connection closed',
  EPIPE: 'connection closed',
  ETIMEDOUT: 'connection timed out',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ENOTFOUND: 'host not found',
  FailedToOpenSocket: 'cannot open a socket',
}

/** describeCause turns a fetch failure into a short phrase (no URL, no stack). */
export function describeCause(cause: unknown): string {
  const code = errorCode(cause)
  if (code && CAUSES[code]) return CAUSES[code]!
  if (code) return code
  return 'connection failed'
}

export function errorCode(cause: unknown): string | undefined {
  if (cause && typeof cause === 'object' && 'code' in cause && typeof cause.code === 'string')
    return cause.code
  return undefined
}
