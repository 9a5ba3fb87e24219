import type { SocketHandler, TCPSocketListener } from 'bun'
import type { Logger } from '../host/logger.ts'
import type { Telemetry } from '../host/telemetry/telemetry.ts'
import type { ConnFront } from './connection.ts'
import { ClientConn } from './dispatch.ts'
import { DEFAULT_FRONT_LIMITS, type FrontLimits, type FrontOptions } from './front-options.ts'
import type { WireRoute } from './route.ts'
import { WaitList } from './waiting.ts'

/** How often the front looks for requests that are arriving too slowly. */
const SWEEP_MS = 1000

/**
 * WireFront is what listens on a listener's public port: an HTTP/1.1 server on Bun's TCP sockets,
 * in front of the framework (Bun.serve + Elysia), which listens on a private Unix socket. It is
 * built the way nginx fronts an application server, because Bun.serve's per-request cost
 * (Request, Headers, Response and stream objects, about 30 µs of CPU for a proxied request on
 * these machines) is twice what a socket-to-socket proxy costs; see test/perf/proxy.ts.
 *
 * - Hot routes (the inference proxy) that implement `wire` are answered here: the request is
 *   parsed strictly (request-parser.ts), the route decides, and a forward runs socket to socket
 *   (WireExchange).
 * - Everything else (admin API, docs, metrics, event streams, and hot requests a route leaves to
 *   the framework) is relayed to the framework's socket by the same WireExchange, re-framed
 *   (validated field lines, its own Content-Length: the framework never sees ambiguous framing),
 *   and its response is relayed back.
 * - Requests under `/internal/` (the cluster's signed API) are vetted first, relayed or hot, on the
 *   raw body as received (FrontOptions.internal): the framework behind only ever sees the body
 *   parsed, so this is the one place a signature over the bytes can be checked.
 * - Connections: keep-alive and pipelining (one request at a time, in order), `100 Continue`,
 *   strict refusals with the listener's error shape, an idle timeout between requests (never
 *   while a response is running: a long generation is not cut), and the client going away aborts
 *   what it asked for at once.
 *
 * The parts: this file is the listener (accepting under the connection caps, the sweep for slow
 * arrivals, the drain count, stop); connection.ts is one client connection's state machine (bytes,
 * clocks, keep-alive, close, the budgets it holds); dispatch.ts is what happens to each request on
 * it (head stage, hot route's action, relay to the framework, span ending); wire-request.ts is the
 * request objects handed to routes and to the internal check; front-options.ts is what a listener
 * is given (options, limits).
 */
export class WireFront implements ConnFront {
  /**
   * listener: the listening socket. With TLS it is replaced when the certificate changes (useTls);
   * everything else here (connections, caps, per-address counts, the drain) belongs to the front
   * and spans the swap.
   */
  private listener: TCPSocketListener<ClientConn>
  private readonly handlers: SocketHandler<ClientConn>
  readonly conns = new Set<ClientConn>()
  readonly limits: FrontLimits
  /** Connections accepted past maxConnections (reserve: health only). */
  overflow = 0
  /** Connections closed at once because the listener was full (a metric's worth, and for tests). */
  rejected = 0
  /** Idle keep-alive connections closed to make room for a new one while the listener was full. */
  reclaimed = 0
  /** Connections with no complete head yet, cut to make room for a new one (see FrontLimits.maxUnauthenticated). */
  shedFresh = 0
  readonly fresh = new WaitList()
  readonly idle = new WaitList()
  /** Open connections by client address (for maxConnectionsPerAddress). */
  private readonly perAddress = new Map<string, number>()
  /** Body bytes held for requests now (see FrontLimits.maxBufferedBodyBytes). */
  bufferedBodyBytes = 0
  /** `/internal/` requests whose bodies are arriving before their signature is checked. */
  unverifiedInternal = 0
  /** Requests running that drain waits for: forwards to engines and hot routes left to the framework. */
  private inflight = 0
  private drainWaiters: (() => void)[] = []
  private readonly sweeper: Timer
  private stopping = false
  /** tracing: the telemetry when it is on (null: off, the one check a request's startTrace makes). */
  readonly tracing: Telemetry | null

  constructor(readonly opts: FrontOptions) {
    const front = this
    this.limits = { ...DEFAULT_FRONT_LIMITS, ...opts.front }
    if (this.limits.maxUnauthenticated <= 0)
      this.limits.maxUnauthenticated = Math.max(1, Math.floor(this.limits.maxConnections / 2))
    this.tracing = opts.telemetry?.enabled ? opts.telemetry : null
    const limits = this.limits
    this.handlers = {
      open(s) {
        // Past a cap, close before reading anything: accept() never meets the fd limit, so the
        // process never spins on it, and connections already open keep being served.
        const address = s.remoteAddress
        const fromAddress = front.perAddress.get(address) ?? 0
        const perAddress = limits.maxConnectionsPerAddress
        const overAddress = perAddress > 0 && fromAddress >= perAddress
        // Room for a new connection is made first from the connections waiting longest for a
        // head (makeRoom), so that connections that send nothing cannot fill the listener.
        if (!overAddress) front.makeRoom()
        const full = front.conns.size >= limits.maxConnections
        if (overAddress || (full && front.overflow >= limits.reserveConnections)) {
          front.rejected++
          s.terminate()
          return
        }
        s.data = new ClientConn(front, s, full, address)
        front.conns.add(s.data)
        front.perAddress.set(address, fromAddress + 1)
        if (full) front.overflow++
        else front.fresh.add(s.data, performance.now())
        if (front.opts.idleTimeoutSeconds > 0) s.timeout(front.opts.idleTimeoutSeconds)
      },
      data(s, d) {
        s.data?.onData(d as Buffer)
      },
      drain(s) {
        s.data?.onDrain()
      },
      close(s) {
        s.data?.onClose()
      },
      error(s) {
        s.data?.onClose()
      },
      timeout(s) {
        s.data?.onTimeout()
      },
    }
    this.listener = opts.tls
      ? this.listenTls(opts.tls)
      : Bun.listen<ClientConn>({
          hostname: opts.hostname,
          port: opts.port,
          socket: this.handlers,
        })
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS)
    this.sweeper.unref()
  }

  /**
   * listenTls opens the TLS listener. It listens with SO_REUSEPORT so that a new certificate can be
   * taken by opening a second listener on the same port before the first stops (useTls): Bun's
   * `reload` keeps the certificate. Because SO_REUSEPORT would let a second modelgate share the
   * port without a word, the port is probed first with a plain listen that shares nothing, so a port
   * in use fails as it does without TLS.
   */
  private listenTls(tls: { cert: string; key: string }): TCPSocketListener<ClientConn> {
    const probe = Bun.listen({ hostname: this.opts.hostname, port: this.opts.port, socket: { data() {} } })
    const port = probe.port
    probe.stop(true)
    return this.listenOn(port, tls)
  }

  private listenOn(port: number, tls: { cert: string; key: string }): TCPSocketListener<ClientConn> {
    // reusePort is not in Bun's types for TCP listeners; Bun.listen takes it.
    return Bun.listen<ClientConn>({
      hostname: this.opts.hostname,
      port,
      tls,
      socket: this.handlers,
      ...({ reusePort: true } as object),
    })
  }

  /**
   * useTls takes a new certificate without a restart: a second listener opens on the same address
   * and port with it (SO_REUSEPORT), then the old one stops accepting. Connections open on the old
   * certificate are served on to their end; new ones get the new certificate. A listener that
   * cannot open leaves the old one serving (the error is logged).
   */
  useTls(tls: { cert: string; key: string }, log?: Logger): boolean {
    if (this.stopping || !this.opts.tls) return false
    let next: TCPSocketListener<ClientConn>
    try {
      next = this.listenOn(this.listener.port, tls)
    } catch (err) {
      log?.error('TLS certificate not taken by a listener: its old certificate stays', {
        listener: this.opts.name,
        error: err instanceof Error ? err.message : String(err),
      })
      return false
    }
    const old = this.listener
    this.listener = next
    old.stop(false)
    return true
  }

  /** sweep refuses requests that arrive too slowly (a head past its deadline, a body below the rate). */
  private sweep(): void {
    const now = performance.now()
    for (const c of this.conns) c.checkArrival(now)
  }

  /**
   * makeRoom, before a new connection is counted: connections with no complete head yet (`fresh`:
   * silent since they opened, or a first head still arriving) may hold at most maxUnauthenticated
   * of the listener, so past it the one that opened longest ago is cut; and a full listener cuts
   * the connection waiting longest for a head, fresh or keep-alive between requests (as nginx
   * reuses its keep-alive connections). Oldest first: a client that means to send a request sends
   * its head as soon as it has connected, so the newest connections (the new one among them) are
   * the likeliest to be served, and a flood of silent connections only ever cuts its own oldest.
   */
  makeRoom(): void {
    const limits = this.limits
    if (this.fresh.size >= limits.maxUnauthenticated) this.cut(this.fresh.oldest as ClientConn)
    if (this.conns.size < limits.maxConnections) return
    const fresh = this.fresh.oldest
    const idle = this.idle.oldest
    const oldest = fresh && (!idle || fresh.waitingSince <= idle.waitingSince) ? fresh : idle
    if (oldest) this.cut(oldest as ClientConn)
  }

  private cut(c: ClientConn): void {
    if (c.waitList === this.idle) this.reclaimed++
    else this.shedFresh++
    c.shed()
  }

  /** forget: a connection closed (its address's count). */
  forget(address: string): void {
    const n = (this.perAddress.get(address) ?? 1) - 1
    if (n > 0) this.perAddress.set(address, n)
    else this.perAddress.delete(address)
  }

  /** inferenceStarted / inferenceEnded count the requests drain() waits for. */
  inferenceStarted(): void {
    this.inflight++
  }

  inferenceEnded(): void {
    if (--this.inflight > 0) return
    const waiters = this.drainWaiters
    this.drainWaiters = []
    for (const w of waiters) w()
  }

  /** running: inference requests (forwards and held requests) not finished yet. */
  get running(): number {
    return this.inflight
  }

  /** drained resolves once no inference request is running (at once when none is). */
  drained(): Promise<void> {
    if (this.inflight === 0) return Promise.resolve()
    return new Promise((resolve) => this.drainWaiters.push(resolve))
  }

  get hostname(): string {
    return this.listener.hostname
  }

  get port(): number {
    return this.listener.port
  }

  get stopped(): boolean {
    return this.stopping
  }

  match(path: string, method: string): WireRoute | undefined {
    for (const r of this.opts.routes) if (r.match(path, method)) return r
    return undefined
  }

  /**
   * stop: no new connections; idle ones close now, busy ones after their response. `force` closes
   * every connection at once (what is running is aborted).
   */
  stop(force: boolean): void {
    if (!this.stopping) {
      this.stopping = true
      this.listener.stop(false)
    }
    if (force) clearInterval(this.sweeper)
    for (const c of [...this.conns]) c.shutdown(force)
  }
}
