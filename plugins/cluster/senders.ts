import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'
import type { Logger } from '../../src/host/logger.ts'
import { AppError, unauthorized } from '../../src/http/errors.ts'

/**
 * ClusterSenders answers, from a request's head, whether it can come from a peer: the pod it names
 * (`X-Cluster-Pod`) must be a current member, and the connection must come from that member's
 * advertised address. It is the first check of the internal API's head stage
 * (InternalVerifier.head), so a request that cannot be a peer's is refused before its body is read
 * or hashed.
 *
 * A current member is a pod this pod's Membership holds: listed by the coordination service (etcd's
 * pod keys, watched: known the moment its key is written; Kubernetes: its next pod listing, every
 * `retry_period_seconds`, once the pod is Ready; static: the YAML list, so with `static` every pod
 * must list every other) or heard from in a signed heartbeat and not yet forgotten. A pod that has
 * just joined may call before its peers list it: those calls are refused (403 UNKNOWN_POD) and
 * nothing is lost, since it is heard from at its next heartbeat once listed. Letting unknown pods in
 * for their first calls would let anyone in, which is what this check exists to stop.
 *
 * The address: a member's advertised host, when an IP literal, is compared with the connection's
 * source (IPv4-mapped IPv6 read as IPv4). A host name is resolved when the member is first seen
 * (a sweep of the membership every SWEEP_MS, and at once on a request naming a member not resolved
 * yet) and again in the background every RESOLVE_EVERY_MS; a request is checked against the last
 * answer, so DNS is never waited for on the hot path. Until a name has resolved once, its member's
 * requests get 503 with Retry-After (this pod could not call that member either). A member that
 * advertises an unspecified address (0.0.0.0, ::) names no source to compare with: not checked.
 * `plugins.cluster.check_source_address: false` turns the address check off, for pods that reach each
 * other through NAT or a proxy (their source is then not the address they advertise).
 */
export interface MemberAddresses {
  /** A current member's advertised base URL; undefined for a pod that is not one. */
  address(podId: string): string | undefined
  /** The other members (resolved ahead of their first request). */
  peers(): { podId: string; address: string }[]
}

export interface ClusterSendersOptions {
  members: MemberAddresses
  /** plugins.cluster.check_source_address */
  checkAddress: boolean
  log: Logger
  now?: () => number
  /** A host name's addresses (default: the system resolver, every family); tests stand in for it. */
  resolve?: (host: string) => Promise<string[]>
}

/** How often the membership is swept for host names to resolve. */
export const SWEEP_MS = 5_000
/** How old a host name's answer may get before it is resolved again (in the background). */
export const RESOLVE_EVERY_MS = 30_000
/** After a failed resolution, the next is tried no sooner than this. */
const RETRY_MS = 1_000
/** Deadline of one resolution. */
const RESOLVE_TIMEOUT_MS = 5_000

/** Sources: where a member's requests may come from. */
type Sources =
  | { kind: 'any' }
  | { kind: 'ips'; ips: ReadonlySet<string> }
  | { kind: 'unresolved' }
  | { kind: 'invalid' }

interface Entry {
  host: string
  sources: Sources
  /** The host is a name (resolved, and again every RESOLVE_EVERY_MS), not an IP literal. */
  named: boolean
  /** When the name is to be resolved (again); 0: at once. */
  due: number
  resolving: boolean
  /** Checked or listed since the last sweep (an entry no member uses any more is dropped). */
  used: boolean
  /** The last resolution failed and was logged (once, until one succeeds). */
  failing: boolean
}

export class ClusterSenders {
  private readonly entries = new Map<string, Entry>()
  private readonly now: () => number
  private readonly resolve: (host: string) => Promise<string[]>
  private timer: Timer | null = null

  constructor(private readonly o: ClusterSendersOptions) {
    this.now = o.now ?? Date.now
    this.resolve = o.resolve ?? resolveAll
  }

  /** start resolves the members' host names now, then sweeps every SWEEP_MS (call once membership is known). */
  start(): void {
    if (this.timer || !this.o.checkAddress) return
    this.sweep()
    this.timer = setInterval(() => this.sweep(), SWEEP_MS)
    this.timer.unref()
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
  }

  /**
   * check: null when a request naming `pod` and coming from `peer` (the connection's address) may be
   * a peer's; else the refusal: 401 without X-Cluster-Pod, 403 UNKNOWN_POD, 403 WRONG_SOURCE_ADDRESS,
   * or 503 POD_ADDRESS_UNRESOLVED while the member's host name has never resolved.
   */
  check(pod: string | null, peer: string): AppError | null {
    if (pod === null) return unauthorized('Missing X-Cluster-Pod header')
    const address = this.o.members.address(pod)
    if (address === undefined)
      return new AppError(403, 'UNKNOWN_POD', `Pod '${shown(pod)}' is not a member of this cluster`)
    if (!this.o.checkAddress) return null
    const entry = this.entry(address)
    entry.used = true
    const sources = entry.sources
    if (sources.kind === 'any') return null
    if (sources.kind === 'ips' && sources.ips.has(canonicalIp(peer) ?? peer)) return null
    if (sources.kind === 'unresolved')
      return new AppError(
        503,
        'POD_ADDRESS_UNRESOLVED',
        `Pod '${pod}' is at '${entry.host}', which has not resolved yet; retry`,
        undefined,
        undefined,
        { 'retry-after': '1' },
      )
    return new AppError(
      403,
      'WRONG_SOURCE_ADDRESS',
      `Pod '${pod}' is at '${entry.host}'; this request comes from ${peer}`,
    )
  }

  /** entry: what is known of `address`, made on first sight; a name due for resolution starts resolving. */
  private entry(address: string): Entry {
    let e = this.entries.get(address)
    if (!e) {
      e = newEntry(address)
      this.entries.set(address, e)
    }
    if (e.named && !e.resolving && this.now() >= e.due) void this.lookup(e)
    return e
  }

  /** sweep: every member's address known (host names resolving), entries no member uses dropped. */
  private sweep(): void {
    const listed = new Set<string>()
    for (const m of this.o.members.peers()) {
      listed.add(m.address)
      this.entry(m.address)
    }
    for (const [address, e] of this.entries) {
      if (!e.used && !listed.has(address)) this.entries.delete(address)
      e.used = false
    }
  }

  /** lookup resolves `e`'s host name; a failure keeps the last answer (a DNS outage locks no peer out). */
  private async lookup(e: Entry): Promise<void> {
    e.resolving = true
    let timer: Timer | undefined
    try {
      const deadline = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer in ${RESOLVE_TIMEOUT_MS} ms`)),
          RESOLVE_TIMEOUT_MS,
        )
      })
      const found = await Promise.race([this.resolve(e.host), deadline])
      const ips = new Set(found.map((a) => canonicalIp(a)).filter((a): a is string => a !== null))
      if (ips.size === 0) throw new Error('no address')
      e.sources = { kind: 'ips', ips }
      e.due = this.now() + RESOLVE_EVERY_MS
      if (e.failing) this.o.log.info('peer host name resolves again', { host: e.host })
      e.failing = false
    } catch (err) {
      e.due = this.now() + RETRY_MS
      if (!e.failing)
        this.o.log.warn('cannot resolve a peer host name; its requests are checked against the last answer', {
          host: e.host,
          error: err instanceof Error ? err.message : String(err),
        })
      e.failing = true
    } finally {
      clearTimeout(timer)
      e.resolving = false
    }
  }
}

/** newEntry: an address's entry; an IP literal (or unspecified) host is known at once. */
function newEntry(address: string): Entry {
  const entry = (host: string, sources: Sources, named = false): Entry => ({
    host,
    sources,
    named,
    due: 0,
    resolving: false,
    used: true,
    failing: false,
  })
  let host: string
  try {
    host = new URL(address).hostname
  } catch {
    return entry(address, { kind: 'invalid' })
  }
  const ip = canonicalIp(host)
  if (ip === '0.0.0.0' || ip === '::') return entry(host, { kind: 'any' })
  if (ip !== null) return entry(host, { kind: 'ips', ips: new Set([ip]) })
  if (host === '') return entry(address, { kind: 'invalid' })
  return entry(host, { kind: 'unresolved' }, true)
}

/**
 * canonicalIp: `s` (an address as a socket or a URL gives it, IPv6 with or without brackets) in one
 * spelling: IPv4 dotted, IPv4-mapped IPv6 as IPv4, other IPv6 compressed lower case; null when `s`
 * is not an IP address.
 */
export function canonicalIp(s: string): string | null {
  const bare = s.startsWith('[') && s.endsWith(']') ? s.slice(1, -1) : s
  const family = isIP(bare)
  if (family === 4) return bare
  if (family !== 6) return null
  let v6: string
  try {
    v6 = new URL(`http://[${bare}]/`).hostname.slice(1, -1)
  } catch {
    return bare.toLowerCase()
  }
  // The URL spells an IPv4-mapped address in hex (::ffff:7f00:1).
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v6)
  if (!mapped) return v6
  const hi = Number.parseInt(mapped[1]!, 16)
  const lo = Number.parseInt(mapped[2]!, 16)
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`
}

/** resolveAll: every address the system resolver gives `host` (IPv4 and IPv6). */
async function resolveAll(host: string): Promise<string[]> {
  return (await lookup(host, { all: true })).map((a) => a.address)
}

/** shown: a client-given pod id as a message may quote it (bounded). */
function shown(pod: string): string {
  return pod.length > 64 ? `${pod.slice(0, 64)}…` : pod
}
