import { categorize } from '../http/auth.ts'
import type { Logger } from './logger.ts'

/**
 * accessLevel: successful requests at debug (health included), 4xx at warn, 5xx at error. A client
 * that went away (499: a user pressing stop, a load generator ending its run) is routine, not a
 * fault of the request: info, as nginx keeps it in the access log and out of the error log. A
 * request the front refused for what the client sent (`refused`: a malformed head, an unknown
 * method's 501, an HTTP version's 505, a body too large...) is the client's fault whatever its
 * status: warn, never error.
 */
export function accessLevel(status: number, refused = false): 'debug' | 'info' | 'warn' | 'error' {
  if (refused) return 'warn'
  if (status >= 500) return 'error'
  if (status === 499) return 'info'
  return status >= 400 ? 'warn' : 'debug'
}

/** Query parameters whose values never reach the log: a JWT for event streams, an OAuth callback's code and state. */
const REDACTED_QUERY = ['token', 'code', 'state']

/** Client-error lines written per second per listener before the rest are only counted. */
export const CLIENT_ERROR_LINES_PER_SECOND = 20

/**
 * AccessLog writes one listener's access lines at accessLevel, secret query values redacted.
 * Client errors (4xx and the front's refusals) are rate-limited: a flood of hostile requests
 * (150,000 fuzzed ones wrote 18.8 MB of log) writes at most CLIENT_ERROR_LINES_PER_SECOND lines a
 * second, and the first line after a quiet second says how many were left out.
 */
export class AccessLog {
  private windowStart = 0
  private written = 0
  private suppressed = 0

  constructor(
    private readonly log: Logger,
    private readonly listener: string,
    private readonly now: () => number = () => performance.now(),
  ) {}

  request(method: string, path: string, query: string, status: number, ms: number, refused = false): void {
    const level = accessLevel(status, refused)
    if (!this.log.enabled(level)) return
    const fields: Record<string, unknown> = {
      listener: this.listener,
      ms: Math.round(ms * 10) / 10,
      category: categorize(path),
    }
    if (level === 'warn' && !this.admit(fields)) return
    this.log.write(level, `${method} ${path}${redact(query)} ${status}`, fields)
  }

  /** admit: a client-error line may be written now (carrying the count left out before it). */
  private admit(fields: Record<string, unknown>): boolean {
    const now = this.now()
    if (now - this.windowStart >= 1000) {
      this.windowStart = now
      this.written = 0
    }
    if (this.written >= CLIENT_ERROR_LINES_PER_SECOND) {
      this.suppressed++
      return false
    }
    this.written++
    if (this.suppressed > 0) {
      fields.suppressed_client_errors = this.suppressed
      this.suppressed = 0
    }
    return true
  }
}

function redact(query: string): string {
  if (!REDACTED_QUERY.some((name) => query.includes(`${name}=`))) return query
  const params = new URLSearchParams(query)
  for (const name of REDACTED_QUERY) if (params.has(name)) params.set(name, 'REDACTED')
  return `?${params}`
}
