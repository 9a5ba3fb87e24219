import { createHmac, timingSafeEqual } from 'node:crypto'
import { ConfigError } from '../../src/config/load.ts'
import type { InternalHead, InternalRequest, InternalVerdict } from '../../src/http/auth.ts'
import { AppError, badRequest, unauthorized } from '../../src/http/errors.ts'
import { RateWindows } from './rate-windows.ts'

/**
 * The signed internal API between pods. Every
 * `/internal/*` request carries `X-Cluster-Signature`, the hex HMAC-SHA256 of method, path (with
 * query), timestamp and raw body concatenated in that order, and `X-Cluster-Timestamp` (Unix ms).
 * The sender also names itself (`X-Cluster-Pod`) and the highest leader term it has seen
 * (`X-Cluster-Term`); those two are not part of the signature, so a command whose term
 * matters for fencing carries the term in its (signed) body as well.
 *
 * The signature alone does not say which pod a request is for, and the internal API is plain HTTP:
 * anyone who sees a request to pod B could send it to pod C within the 30 s window (C has not seen
 * it, so its replay check passes). Every signed request therefore names its destination in the
 * signed target, the query parameter `to=<pod id>` (addressedTo), and a pod refuses one that names
 * another pod, or none (403 `WRONG_DESTINATION`). Putting it in the query keeps the signature
 * as it is: the path with its query is already signed.
 */
export const CLUSTER_HEADERS = {
  signature: 'x-cluster-signature',
  timestamp: 'x-cluster-timestamp',
  pod: 'x-cluster-pod',
  term: 'x-cluster-term',
} as const

/** DESTINATION_PARAM: the query parameter naming the pod a signed request is for (its first occurrence). */
export const DESTINATION_PARAM = 'to'

/** addressedTo: `pathWithQuery` with the destination pod appended to its query (sign and send this). */
export function addressedTo(pathWithQuery: string, podId: string): string {
  const sep = pathWithQuery.includes('?') ? '&' : '?'
  return `${pathWithQuery}${sep}${DESTINATION_PARAM}=${encodeURIComponent(podId)}`
}

/** destinationOf: the pod a signed target names (its first `to` parameter), or null when it names none. */
export function destinationOf(target: string): string | null {
  const q = target.indexOf('?')
  if (q < 0) return null
  return new URLSearchParams(target.slice(q + 1)).get(DESTINATION_PARAM)
}

/** The shortest CLUSTER_SECRET accepted. */
export const MIN_SECRET_LENGTH = 16
/** A timestamp more than this far from the receiver's clock, either way, is refused. */
export const MAX_SKEW_MS = 30_000
/**
 * DEFAULT_UNLIMITED_PREFIXES: the pod-to-pod inference hop. Its traffic is user traffic already
 * admitted (key, limits) at the edge pod, so the per-address limit of the internal API would only
 * cap a healthy cluster's throughput; it is still signed, timestamped and replay-checked, and its
 * requests that fail verification are counted like any other (InternalVerifier).
 */
export const DEFAULT_UNLIMITED_PREFIXES: readonly string[] = ['/internal/v1/']

/** signRequest: the hex HMAC-SHA256 of method, path with query, timestamp (ms) and raw body, in that order. */
export function signRequest(
  secret: string,
  method: string,
  pathWithQuery: string,
  timestampMs: number,
  body: Uint8Array,
): string {
  return createHmac('sha256', secret)
    .update(method)
    .update(pathWithQuery)
    .update(String(timestampMs))
    .update(body)
    .digest('hex')
}

/** The cluster secrets of the auth section (auth.cluster_secret, auth.cluster_secret_previous). */
export interface ClusterSecrets {
  cluster_secret?: string | undefined
  cluster_secret_previous?: string | undefined
}

/**
 * clusterSecretProblems: what is wrong with the secrets of the signed internal API, by dotted path:
 * a secret shorter than MIN_SECRET_LENGTH, and (when the cluster needs one: `required`) a missing
 * `auth.cluster_secret`. The cluster plugin's `validate` reports them with every other config problem.
 */
export function clusterSecretProblems(auth: ClusterSecrets, required = true): string[] {
  const problems: string[] = []
  if (required && !auth.cluster_secret)
    problems.push(
      `auth.cluster_secret: required when the cluster plugin is on (CLUSTER_SECRET, at least ${MIN_SECRET_LENGTH} characters)`,
    )
  const given: [string, string | undefined][] = [
    ['auth.cluster_secret', auth.cluster_secret],
    ['auth.cluster_secret_previous', auth.cluster_secret_previous],
  ]
  for (const [path, value] of given)
    if (value && value.length < MIN_SECRET_LENGTH)
      problems.push(`${path}: must be at least ${MIN_SECRET_LENGTH} characters`)
  return problems
}

/** checkClusterSecrets throws clusterSecretProblems as a ConfigError (for a plugin that verifies internal calls). */
export function checkClusterSecrets(auth: ClusterSecrets, required = true): void {
  const problems = clusterSecretProblems(auth, required)
  if (problems.length > 0) throw new ConfigError(problems)
}

export interface InternalVerifierOptions {
  /** This pod's id: a signed request must name it as its destination (`to=`). */
  podId: string
  /**
   * The secrets accepted: auth.cluster_secret (what peers sign with), then
   * auth.cluster_secret_previous (still accepted while a rotation rolls through the pods).
   */
  secrets: readonly string[]
  /**
   * Requests a second per source address (plugins.cluster.internal_rate_limit); 429 beyond. The same
   * number bounds the requests from one address that fail verification, on every path.
   */
  rateLimit: number
  /** Paths exempt from the rate limit only (default DEFAULT_UNLIMITED_PREFIXES). */
  unlimitedPrefixes?: readonly string[]
  /**
   * Signatures remembered at once (each for at most 2 × MAX_SKEW_MS). Full even after forgetting
   * expired ones means more signed traffic than replay protection can vouch for: 429.
   */
  replayCapacity?: number
  /**
   * senders: whether a request naming pod `pod` (X-Cluster-Pod) and coming from `peer` can be a
   * member's (ClusterSenders.check); null when it can, else the refusal. Absent: not checked.
   */
  senders?: (pod: string | null, peer: string) => AppError | null
  /** The clock (Unix ms); tests drive it. */
  now?: () => number
}

const HEX_SIGNATURE = /^[0-9a-fA-F]{64}$/
const INTEGER = /^-?\d{1,16}$/
const TERM = /^\d{1,16}$/

/**
 * InternalVerifier checks one signed request in two stages, in the order that keeps a flood cheap.
 *
 * head (from the request's head, before a byte of its body is read, AuthService.internalHead): the
 * source's rate, then the headers and the timestamp (±30 s), then the sender (a current member, from
 * its own address: `senders`), then the destination (this pod, by `to=`). No HMAC is computed there.
 * verify (on the raw body as received, AuthService.vetInternal): the timestamp again (a slow body may
 * have outlived it), the signature against the current then the previous secret (constant time), the
 * destination, then replay (the same signature already accepted within the window).
 *
 * The rate, per source address and sliding second, is one number (`rateLimit`) counting two things:
 * requests to a limited path (counted at the head, refused or not later), and requests refused as
 * unauthentic, by the head or by the signature, on any path (the inference hop included). Either
 * count past the limit is 429 from the head: a flood of unsigned or badly signed requests is answered
 * from the head once `rateLimit` of them failed within a second, while the hop's verified traffic
 * is never counted. Requests refused 429 are not counted, so a sender that slows down gets through.
 */
export class InternalVerifier {
  private readonly secrets: string[]
  private readonly podId: string
  private readonly rateLimit: number
  private readonly unlimited: readonly string[]
  private readonly capacity: number
  private readonly now: () => number
  private readonly senders: InternalVerifierOptions['senders']
  /** Accepted signatures → when they may be forgotten (their timestamp is then too old anyway). */
  private readonly seen = new Map<string, number>()
  /** Requests to limited paths, per source address. */
  private readonly calls: RateWindows
  /** Requests refused as unauthentic (head or signature), per source address. */
  private readonly failures: RateWindows

  constructor(opts: InternalVerifierOptions) {
    this.secrets = opts.secrets.filter((s) => s.length > 0)
    if (this.secrets.length === 0) throw new Error('InternalVerifier needs at least one cluster secret')
    if (!opts.podId) throw new Error('InternalVerifier needs the pod id requests must be addressed to')
    this.podId = opts.podId
    this.rateLimit = opts.rateLimit
    this.unlimited = opts.unlimitedPrefixes ?? DEFAULT_UNLIMITED_PREFIXES
    this.capacity = opts.replayCapacity ?? 500_000
    this.now = opts.now ?? Date.now
    this.senders = opts.senders
    this.calls = new RateWindows(opts.rateLimit)
    this.failures = new RateWindows(opts.rateLimit)
  }

  /**
   * head: the first stage, on the request's head (see the class comment); null lets its body be read
   * and verify judge it. The front calls it for every internal request before verify.
   */
  head(req: InternalHead): AppError | null {
    const now = this.now()
    const peer = req.peer
    const failing = this.failures.wait(peer, now)
    if (failing > 0)
      return rateLimited(
        `More than ${this.rateLimit} internal requests from this address failed verification in the last second`,
        failing,
      )
    if (!this.unlimited.some((p) => req.target.startsWith(p))) {
      const wait = this.calls.take(peer, now)
      if (wait > 0) return rateLimited(`More than ${this.rateLimit} internal requests a second`, wait)
    }
    const error =
      headerProblem(req, now) ??
      this.senders?.(req.headers.get(CLUSTER_HEADERS.pod), peer) ??
      this.destinationProblem(req.target)
    return error ? this.failed(peer, now, error) : null
  }

  /** verify: the second stage, on the raw body, for a request whose head passed (see the class comment). */
  verify(req: InternalRequest): InternalVerdict {
    const now = this.now()
    const refused = (error: AppError) => refuse(this.failed(req.peer, now, error))
    const header = headerProblem(req, now)
    if (header) return refused(header)
    const ts = Number(req.headers.get(CLUSTER_HEADERS.timestamp))
    const given = Buffer.from(req.headers.get(CLUSTER_HEADERS.signature)!, 'hex')
    let matched: string | null = null
    for (const secret of this.secrets) {
      const expected = signRequest(secret, req.method, req.target, ts, req.body)
      if (timingSafeEqual(Buffer.from(expected, 'hex'), given)) matched = expected
    }
    if (matched === null) return refused(unauthorized('Invalid cluster signature'))
    const wrong = this.destinationProblem(req.target)
    if (wrong) return refused(wrong)
    if (this.seen.has(matched)) return refused(unauthorized('Replayed cluster request'))
    if (!this.remember(matched, ts + MAX_SKEW_MS, now))
      return refuse(rateLimited('Too many signed internal requests to track for replay', 1))
    const pod = req.headers.get(CLUSTER_HEADERS.pod)
    const term = req.headers.get(CLUSTER_HEADERS.term)
    if (term !== null && !TERM.test(term))
      return refuse(badRequest('X-Cluster-Term must be a non-negative integer'))
    return { ok: true, pod, term: term === null ? null : Number(term) }
  }

  /** failed counts a refusal of an unauthentic request (401, 403) against its source address; returns it. */
  private failed(peer: string, now: number, error: AppError): AppError {
    if (error.status === 401 || error.status === 403) this.failures.take(peer, now)
    return error
  }

  /** destinationProblem: 403 WRONG_DESTINATION unless `target` names this pod (its first `to=`). */
  private destinationProblem(target: string): AppError | null {
    const to = destinationOf(target)
    if (to === this.podId) return null
    return new AppError(
      403,
      'WRONG_DESTINATION',
      to === null
        ? `Signed cluster request names no destination pod (${DESTINATION_PARAM}=); this is pod '${this.podId}'`
        : `Signed cluster request is for pod '${to}', not this pod ('${this.podId}')`,
    )
  }

  /**
   * remember keeps an accepted signature until `until`. Signatures are kept in arrival order, so
   * expired ones are dropped from the front as new ones come; a full table is swept once before
   * it refuses (false).
   */
  private remember(signature: string, until: number, now: number): boolean {
    for (const [sig, expiry] of this.seen) {
      if (expiry >= now) break
      this.seen.delete(sig)
    }
    if (this.seen.size >= this.capacity) {
      for (const [sig, expiry] of this.seen) if (expiry < now) this.seen.delete(sig)
      if (this.seen.size >= this.capacity) return false
    }
    this.seen.set(signature, until)
    return true
  }
}

/**
 * headerProblem: what is wrong with a request's signature headers, from the head alone: either one
 * missing, a timestamp that is no integer or more than MAX_SKEW_MS from `now`, a signature that is
 * not 64 hex digits. Null when they can be checked against the body.
 */
function headerProblem(req: InternalHead, now: number): AppError | null {
  const signature = req.headers.get(CLUSTER_HEADERS.signature)
  const stamp = req.headers.get(CLUSTER_HEADERS.timestamp)
  if (signature === null) return unauthorized('Missing X-Cluster-Signature header')
  if (stamp === null) return unauthorized('Missing X-Cluster-Timestamp header')
  if (!INTEGER.test(stamp))
    return unauthorized('X-Cluster-Timestamp must be an integer (Unix time in milliseconds)')
  const ts = Number(stamp)
  if (now - ts > MAX_SKEW_MS) return unauthorized('X-Cluster-Timestamp is more than 30 s old')
  if (ts - now > MAX_SKEW_MS) return unauthorized('X-Cluster-Timestamp is more than 30 s ahead')
  if (!HEX_SIGNATURE.test(signature)) return unauthorized('Invalid cluster signature')
  return null
}

function refuse(error: AppError): InternalVerdict {
  return { ok: false, error }
}

function rateLimited(message: string, retryAfterSeconds: number): AppError {
  return new AppError(429, 'RATE_LIMITED', message, 'rate_limit_error', undefined, {
    'retry-after': String(retryAfterSeconds),
  })
}
