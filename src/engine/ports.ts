import { type BoundSocket, bindTcp } from './tcp-bind.ts'

/**
 * PortAllocator hands out engine ports from a configured range: never a port an instance of this
 * modelgate has (the caller passes those), and only a port a bind on the engine's host shows free.
 *
 * Several modelgates on one host may share a range, and vLLM binds its port long before it listens
 * (it binds, then loads the model for minutes, then listens), so "nothing listens there" proves
 * nothing. A port is first claimed with an exclusive bind (no SO_REUSEADDR, no SO_REUSEPORT), which
 * fails on any socket bound there, listening or not. The claim then keeps that socket bound, not
 * listening, with both reuse options turned on, until the caller releases it (the engine is up or
 * gone): the engine's own bind (vLLM, uvicorn, Go, Rust, Node and Bun servers all set one of the two
 * options) passes, while another modelgate's exclusive bind keeps failing, so it picks another port.
 *
 * A port whose last engine just stopped holds its closed connections in TIME_WAIT for a minute,
 * which an exclusive bind also counts; when no port of the range passes it, a port nothing listens
 * on is taken instead (a SO_REUSEADDR bind passes), and the engine identity check at readiness is
 * what catches a collision then. Without libc (not Linux) the claim is a Bun.listen probe, no hold.
 */

/** PortClaim: a port handed out; release it once the engine listens there or is gone. */
export interface PortClaim {
  readonly port: number
  release(): void
}

/**
 * How sure a claim is: `exclusive` (nothing at all is bound there) or `unlistened` (nothing listens
 * there and nothing holds it exclusively; closed connections or a starting engine may remain).
 */
export type ClaimMode = 'exclusive' | 'unlistened'

/** listenProbe is the fallback without libc: Bun.listen (which sets SO_REUSEADDR) opens and closes. */
function listenProbe(host: string, port: number): boolean {
  try {
    Bun.listen({ hostname: host, port, socket: { data() {} } }).stop(true)
    return true
  } catch {
    return false
  }
}

/** claimPort binds `port` on `host` as `mode` says and keeps it bound; null when it is taken. */
export function claimPort(host: string, port: number, mode: ClaimMode): PortClaim | null {
  const bound = bindTcp(host, port, mode === 'exclusive' ? {} : { reuseAddr: true })
  if (bound === null) return listenProbe(host, port) ? { port, release() {} } : null
  if (!bound.ok) return null
  const socket: BoundSocket = bound.socket
  socket.setOptions({ reuseAddr: true, reusePort: true })
  return { port, release: () => socket.close() }
}

export class PortAllocator {
  private next: number

  constructor(
    private readonly host: string,
    private readonly start: number,
    private readonly end: number,
  ) {
    this.next = start
  }

  /**
   * allocate claims a port not in `taken`, scanning round-robin from the last one given: first one
   * an exclusive bind proves free, else one nothing listens on. Null when the range has none.
   */
  allocate(taken: ReadonlySet<number>): PortClaim | null {
    const size = this.end - this.start + 1
    for (const mode of ['exclusive', 'unlistened'] as const) {
      for (let i = 0; i < size; i++) {
        const port = this.start + ((this.next - this.start + i) % size)
        if (taken.has(port)) continue
        const claim = claimPort(this.host, port, mode)
        if (!claim) continue
        this.next = port + 1 > this.end ? this.start : port + 1
        return claim
      }
    }
    return null
  }

  /** claim takes a port the load asked for: it is enough that nothing listens there. */
  claim(port: number): PortClaim | null {
    return claimPort(this.host, port, 'unlistened')
  }
}
