import type { Registry } from 'prom-client'
import { abortable, WaitError } from '../host/abortable.ts'
import type { BusChannel, EventBus } from '../host/bus.ts'
import type { Logger } from '../host/logger.ts'
import type { RequestTrace, SpanBase, TraceSpan } from '../host/telemetry/spans.ts'
import type { AppError } from '../http/errors.ts'
import type { BodyRange } from '../wire/body-range.ts'
import type { ScannedJson } from '../wire/json-scan.ts'
import type { ForwardEnd, InferenceGrant, WireAction } from '../wire/route.ts'
import { askForUsage, charged, requestCost, USAGE_STREAMS, type UsageMode } from '../wire/usage.ts'
import type { Backend, BackendKind, BackendRequest, LeaseHandle, Readiness } from './backend.ts'
import { Displaced, HoldQueue, queueShare, type Seat } from './hold-queue.ts'
import { orderBackends } from './order.ts'
import { type HoldOutcome, registerHoldMetrics, type WakePolicy, WakeRecord } from './wake.ts'

/**
 * ModelDirectory is the one owner of the question "a request for model X arrived: where does it go
 * now, and what must happen first?", asked by every listener: the gateway's `/v1`, the router's
 * inference routes and a pod receiving a hop. It is the host's (like the bus), so the router has it
 * without the gateway; each plugin adds the backends it owns (sources): the gateway its instances,
 * the router its configured endpoints, the cluster the other pods that serve a model.
 *
 * For one request (`plan`) it gathers the backends that can serve the name, orders them once
 * (order.ts), and either
 * - leases the best one: the backend counts the request until its response ends (the one in-flight
 *   count per backend that drains wait on), and the end is recorded once (`proxy.request`);
 * - wakes what sleeps: each backend's one wake, shared by every request, operator and policy that
 *   asks (`wake`), then the listener's policy: reject with Retry-After from the model's measured
 *   wakes (the one estimator, WakeRecord), or hold the request until the model serves, counting it
 *   as held (`held`), which eviction and idle rules read;
 * - or refuses, saying what the refusal is, in the listener's own words (DirectoryAnswers).
 *
 * A request that comes with a grant (an inference key, src/http/keys/) asks it, once a backend has
 * the model, whether the key may use it and has room for the request's worst case in tokens
 * (`begin`), is held in the key's priority order (hold-queue.ts), and tells it its end once, with
 * what it used: the engine's token counts, which the forward reads (a stream is made to ask the
 * engine for them, and their chunk is kept from a client that did not ask: src/wire/usage.ts), or,
 * for a stream cut before them, what reached the client (usage.ts `charged`).
 */
export interface BackendSource {
  /** backends: this source's backends for a name a client uses (a served name or an alias), in its order. */
  backends(name: string): readonly Backend[]
}

/** DirectoryAnswers: a listener's refusals, in its own vocabulary and error shape. */
export interface DirectoryAnswers {
  /** No backend of the listener's kinds has this name. */
  unknown(model: string): AppError
  /** 503 with Retry-After while the model wakes (reject, the hold's deadline, a stop). */
  waking(model: string, retryAfterSeconds: number, message?: string): AppError
  /** 503 while it is still loading; Retry-After as the backend estimates it (null: the listener's). */
  starting(model: string, retryAfterSeconds: number | null): AppError
  /** 502: its wake failed. */
  wakeFailed(model: string, reason: string): AppError
  /** 503: it exists but cannot serve now (failed, stopping, out of routing). */
  unavailable(model: string): AppError
  /** 429: as many requests wait for it as its queue holds. */
  queueFull(model: string, retryAfterSeconds: number): AppError
  /** 503: the server is stopping: a request held for the model is answered now, not served here. */
  stopping(model: string): AppError
}

/** Retry-After of a wake when none was measured and the backend cannot tell. */
const DEFAULT_WAKE_SECONDS = 5

/** ListenerPlan: how a listener wants its requests planned. */
export interface ListenerPlan {
  /** The kinds of backend this listener serves (a hop's landing pod: its instances only). */
  kinds: ReadonlySet<BackendKind>
  policy: WakePolicy
  holdTimeoutMs: number
  answers: DirectoryAnswers
  /**
   * books: the listener's own accounts (the router's statistics): `ended` once per request that
   * named a model, whatever its end (forwarded, refused, client gone); `holding` when a hold begins
   * and ends.
   */
  books?: {
    ended(status: number, durationMs: number): void
  }
}

/** PlanRequest: the request as the listener parsed it (its model is named separately). */
export interface PlanRequest extends Omit<BackendRequest, 'model' | 'holdTimeoutMs'> {
  /** performance.now() when the request was complete (durations of refusals). */
  readonly startedAt: number
  /** grant: the request's inference key (begun, held by priority, told its end); null or absent: none. */
  readonly grant?: InferenceGrant | null
  /** usage: set by the directory for a granted request: its forward reads the engine's token counts. */
  readonly usage?: UsageMode
}

/**
 * MAX_HOLDS: the most times one request waits for its model to wake or load. A model evicted again
 * between its wake and the request's turn is woken again for it (each wait within the first one's
 * deadline); a third eviction in a row says the host cannot keep it, and the request is refused.
 */
export const MAX_HOLDS = 3

/** Waited: a request that already waited for its model: how many times, and until when it may. */
interface Waited {
  holds: number
  /** performance.now() past which it waits no more (its first wait's end) */
  deadline: number
}

/** A request without a key is held as a key of `normal` priority is. */
const NORMAL_PRIORITY = 1

/** A leased request's end, announced on the bus once (what every counter of requests reads). */
export interface ProxyRequestEvent {
  /** The model as the client named it. */
  model: string
  /** The served model name of the backend that took it (absent: the same as `model`). */
  served?: string
  instance_id: string | null
  status: number
  duration_ms: number
  ttft_ms: number | null
  streamed: boolean
  path: string
  /** pod_id: the pod that served a request this pod relayed to it (a cluster hop); absent when local. */
  pod_id?: string
  /** error: the proxy's error code when the upstream failed (upstream_unavailable, upstream_timeout…). */
  error?: string
}

declare module '../host/bus.ts' {
  interface BusEvents {
    'proxy.request': ProxyRequestEvent
  }
}

export class ModelDirectory {
  private readonly sources: BackendSource[] = []
  /** Per served model name: its wakes (durations, the one under way, the last failure). */
  private readonly records = new Map<string, WakeRecord>()
  /** Per served model name: requests held for it now, in the order they go on. */
  private readonly holding = new Map<string, HoldQueue>()
  /** Per served model name: the wake requests started and joined (wakeFirst), while it runs. */
  private readonly runs = new Map<string, WakeRun>()
  /** Aborted when the host stops: held requests are answered at once. */
  private readonly lifetime = new AbortController()
  /** Aborted when the host begins to stop: requests queued for a load are answered at once. */
  private readonly queues = new AbortController()
  /** Each leased request's end (ended), announced when anyone listens. */
  private readonly requests: BusChannel<ProxyRequestEvent>

  constructor(
    private readonly bus: EventBus,
    private readonly log: Logger,
    metrics: Registry,
  ) {
    registerHoldMetrics(metrics, bus)
    this.requests = bus.channel('proxy.request')
  }

  /** addSource: a plugin's backends join the directory; returns their removal. */
  addSource(source: BackendSource): () => void {
    this.sources.push(source)
    return () => {
      const i = this.sources.indexOf(source)
      if (i >= 0) this.sources.splice(i, 1)
    }
  }

  /** stop: held requests end now (503), and no request is held any more. */
  stop(): void {
    this.queues.abort()
    this.lifetime.abort()
  }

  /**
   * stopQueues: requests queued for a model's load end now (503): nothing loads during a shutdown.
   * Requests held for a wake stay, counted by the drain (a wake is quick; stop() ends them after).
   */
  stopQueues(): void {
    this.queues.abort()
  }

  /** candidates: the backends of `kinds` that can serve `name`, best first (order.ts). */
  candidates(
    name: string,
    kinds: ReadonlySet<BackendKind>,
    exclude?: ReadonlySet<string>,
  ): readonly Backend[] {
    // Per request: the one list of the common case (a single source names the model, every backend
    // of it of the listener's kinds) is ordered as the source gave it, with no copy made.
    const sources = this.sources
    let whole: readonly Backend[] | null = null
    let found: Backend[] | null = null
    for (let i = 0; i < sources.length; i++) {
      const list = sources[i]!.backends(name)
      if (list.length === 0) continue
      if (whole === null && found === null && allTaken(list, kinds, exclude)) {
        whole = list
        continue
      }
      if (found === null) found = whole === null ? [] : whole.slice()
      whole = null
      for (const b of list) if (taken(b, kinds, exclude)) found.push(b)
    }
    return orderBackends(found ?? whole ?? NONE)
  }

  /** held: requests held for a model now (waiting for its wake). */
  held(model: string): number {
    return this.holding.get(model)?.size ?? 0
  }

  // ---- the wakes of every backend, and what they teach ----

  /**
   * wake: the backend's wake for a request. A backend's wake is its one wake, joined by whoever
   * asks while it runs (a request, an operator, the router), so this starts or joins it; a failure
   * is remembered for the model (requests are then refused for WAKE_RETRY_MS, not each retried).
   * `trace`: the waiting request's span, under which the wake is drawn (Backend.wake).
   */
  wake(b: Backend, trace?: SpanBase | null): Promise<void> {
    if (!b.wake) return Promise.resolve()
    return b.wake(trace).catch((err: Error) => {
      this.record(b.model).failed(performance.now(), err.message)
      throw err
    })
  }

  /**
   * record: a model's wake record, which its backends keep up to date as their wakes start, succeed,
   * end or fail (whoever started them): the one estimate of how long the next one takes.
   */
  record(model: string): WakeRecord {
    let r = this.records.get(model)
    if (!r) {
      r = new WakeRecord()
      this.records.set(model, r)
    }
    return r
  }

  /**
   * retryAfterSeconds: the rest of a wake of `b`'s model now: from its measured wakes, else as the
   * backend estimates it, else DEFAULT_WAKE_SECONDS.
   */
  retryAfterSeconds(b: Backend): number {
    return (
      this.record(b.model).retryAfterSeconds(performance.now()) ??
      b.retryAfterSeconds?.() ??
      DEFAULT_WAKE_SECONDS
    )
  }

  // ---- planning a request ----

  /** plan: what to do with one request for `model` (a name a client uses), as a front action. */
  plan(model: string, req: PlanRequest, p: ListenerPlan): WireAction {
    if (!req.grant) return this.planOnce(model, req, p, null, undefined)
    return this.planOnce(model, withUsage(req), p, null, undefined)
  }

  private planOnce(
    model: string,
    req: PlanRequest,
    p: ListenerPlan,
    after: Waited | null,
    exclude: ReadonlySet<string> | undefined,
  ): WireAction {
    const cands = this.candidates(model, p.kinds, exclude)
    const best = cands[0]
    if (!best) return this.refuse(p, req, p.answers.unknown(model))
    // The key begins once its model is known to exist (a name no backend has is refused first, and
    // counted under no name of its own), reserving the request's worst case when it has token limits.
    const grant = req.grant
    if (grant && after === null && exclude === undefined) {
      const worst = grant.metered ? requestCost(req.body.length, req.json, best.contextTokens?.() ?? null) : 0
      const denied = grant.begin(model, worst)
      if (denied) return this.refuse(p, req, denied)
    }
    switch (best.readiness()) {
      case 'ready':
        return this.lease(best, model, req, p, exclude)
      case 'asleep':
      case 'waking':
        // Another pod wakes its own: the request goes there and waits (or is refused) on that pod.
        if (!best.local || !best.wake) return this.lease(best, model, req, p, exclude)
        return this.wakeFirst(cands, model, req, p, after)
      case 'starting':
      case 'absent':
        // A model served on demand: its request waits in the model's queue for the load.
        if (best.local && best.wake && best.queue?.()) return this.wakeFirst(cands, model, req, p, after)
        if (best.readiness() === 'absent') return this.refuse(p, req, p.answers.unknown(model))
        return this.refuse(p, req, p.answers.starting(model, best.retryAfterSeconds?.() ?? null))
      case 'unavailable':
        return this.refuse(p, req, p.answers.unavailable(model))
    }
  }

  /**
   * wakeFirst: the model sleeps here: every sleeping backend of it is woken (the request goes on as
   * soon as one serves), then the listener's policy. A request that already waited for a wake and
   * finds the model asleep again (evicted between its wake and its turn) waits again, within the
   * deadline of its first wait and at most MAX_HOLDS times in all; past either it is refused with
   * Retry-After.
   */
  private wakeFirst(
    cands: readonly Backend[],
    model: string,
    req: PlanRequest,
    p: ListenerPlan,
    after: Waited | null,
  ): WireAction {
    const first = cands[0]!
    const name = first.model
    const retryAfter = () => this.retryAfterSeconds(first)
    // A model whose last wake or load failed says so, also to a request that waited for it.
    const failure = this.record(name).recentFailure(performance.now())
    if (failure) return this.refuse(p, req, p.answers.wakeFailed(name, failure))
    if (after) {
      // Not loaded after all (its load ended without serving, and not by a failure): it cannot
      // serve now. Asleep again: it waits again while its deadline and its holds last.
      if (first.readiness() === 'absent') return this.refuse(p, req, p.answers.unavailable(name))
      if (after.holds >= MAX_HOLDS || performance.now() >= after.deadline)
        return this.refuse(p, req, p.answers.waking(name, retryAfter()))
    }
    const queue = first.queue?.() ?? null
    const seat = seatOf(req, queue)
    if (queue && !(this.holding.get(name)?.hasRoom(seat, queue.max) ?? queue.max > 0))
      return this.refuse(p, req, p.answers.queueFull(name, retryAfter()))
    // What can come to serve (a stopping or failed instance beside a catalogued model cannot).
    const sleepers = cands.filter((b) => b.local && b.wake && wakeable(b.readiness()))
    const holds = !(p.policy === 'reject' && !queue)
    // Traced: a held request's wait is a span, the wake under it; a refused one's wake is its own child.
    const held = holds
      ? (req.trace?.child('modelgate.hold', {
          'gen_ai.request.model': name,
          'modelgate.hold.queued': queue !== null,
        }) ?? null)
      : null
    const wake = this.join(name, sleepers, held ?? req.trace).done
    if (!holds) return this.refuse(p, req, p.answers.waking(name, retryAfter()))
    return { defer: (signal) => this.hold(first, model, wake, req, p, signal, queue, seat, held, after) }
  }

  /**
   * join: the model's wake for a request: the one requests started, while it runs, or a new one of
   * every backend of it that sleeps or loads (it serves as soon as one does). Its end is the
   * directory's once, however many requests wait for it and through whichever backends: each
   * backend's failure is recorded for its model, and a wake that serves nothing is logged in one
   * line with how many requests it failed.
   */
  private join(model: string, sleepers: readonly Backend[], trace: SpanBase | null | undefined): WakeRun {
    const under = this.runs.get(model)
    if (under) {
      under.requests++
      trace?.event('modelgate.wake.joined', { 'gen_ai.request.model': model })
      return under
    }
    const run: WakeRun = { requests: 1, cancelled: false, done: RESOLVED }
    const wakes = sleepers.map((b) =>
      b.wake!(trace).catch((err: Error) => {
        // Cancelled because nobody waited for it any more: no failure of the model.
        if (!run.cancelled) this.record(b.model).failed(performance.now(), err.message)
        throw err
      }),
    )
    const served =
      wakes.length === 1
        ? wakes[0]!
        : Promise.any(wakes).then(
            () => {},
            (err: AggregateError) => Promise.reject(err.errors[0]),
          )
    run.done = served.then(
      () => {
        if (this.runs.get(model) === run) this.runs.delete(model)
      },
      (err: Error) => {
        if (this.runs.get(model) === run) this.runs.delete(model)
        if (!run.cancelled)
          this.log.warn('wake on request failed', { model, error: err.message, requests: run.requests })
        throw err
      },
    )
    // Every request awaits it through its hold (or not at all, when refused at once).
    run.done.catch(() => {})
    this.runs.set(model, run)
    return run
  }

  /** cancelRun: the model's wake under way was cancelled (nobody waits): it ends, not fails, and is not joined. */
  private cancelRun(model: string): void {
    const run = this.runs.get(model)
    if (!run) return
    run.cancelled = true
    this.runs.delete(model)
  }

  /** hold: the request waits for the wake (up to hold_timeout), then is planned again. */
  private async hold(
    first: Backend,
    model: string,
    wake: Promise<void>,
    req: PlanRequest,
    p: ListenerPlan,
    client: AbortSignal,
    queue: { max: number; timeoutMs: number } | null,
    seat: Seat,
    span: TraceSpan | null,
    after: Waited | null,
  ): Promise<WireAction> {
    const t0 = performance.now()
    const name = first.model
    let waiting = this.holding.get(name)
    if (!waiting) {
      waiting = new HoldQueue()
      this.holding.set(name, waiting)
    }
    const waiter = waiting.enter(seat, wake, queue?.max ?? null)
    if (!waiter) return this.refuse(p, req, p.answers.queueFull(name, this.retryAfterSeconds(first)))
    let outcome: HoldOutcome = 'awake'
    let reason = ''
    const limitMs = queue?.timeoutMs ?? p.holdTimeoutMs
    // A second wait ends where the first would have (its deadline), not a whole timeout later.
    const deadline = after?.deadline ?? t0 + limitMs
    const timeoutMs = Math.max(0, deadline - t0)
    try {
      const signal = AbortSignal.any([client, queue ? this.queues.signal : this.lifetime.signal])
      await abortable(waiter.done, { signal, timeoutMs, what: `the wake of ${name}` })
    } catch (err) {
      if (err instanceof Displaced) outcome = 'displaced'
      else if (!(err instanceof WaitError)) {
        outcome = 'wake_failed'
        reason = (err as Error).message
      } else if (err.kind === 'timeout') outcome = 'timeout'
      else outcome = client.aborted ? 'client_gone' : 'stopping'
    } finally {
      waiting.leave(waiter)
      if (waiting.size === 0 && this.holding.get(name) === waiting) {
        this.holding.delete(name)
        // The last request waiting for it left: a load only requests asked for may stop, and a
        // load so cancelled is no failure: the next request starts another.
        if (outcome === 'client_gone' && first.abandoned?.()) this.cancelRun(name)
      }
    }
    this.bus.emit('proxy.held', { model: name, outcome, held_ms: performance.now() - t0 })
    if (span) {
      span.setAttributes({ 'modelgate.hold.outcome': outcome })
      const failed = outcome === 'wake_failed' || outcome === 'timeout' || outcome === 'stopping'
      span.end(failed ? reason || outcome : undefined)
    }
    const retryAfter = () => this.retryAfterSeconds(first)
    switch (outcome) {
      case 'awake':
        return this.planOnce(model, req, p, { holds: (after?.holds ?? 0) + 1, deadline }, undefined)
      case 'client_gone':
        p.books?.ended(499, performance.now() - req.startedAt)
        req.grant?.end(499, null)
        return { error: p.answers.waking(name, 0, 'The client went away') }
      case 'displaced':
        return this.refuse(p, req, p.answers.queueFull(name, retryAfter()))
      case 'timeout': {
        // A model served on demand says what its load is doing (the issue's "the load's phase").
        const phase = queue ? (first.phase?.() ?? null) : null
        const what = queue ? 'serve' : 'wake up'
        return this.refuse(
          p,
          req,
          p.answers.waking(
            name,
            retryAfter(),
            `Model '${name}' did not ${what} within ${limitMs / 1000} s${phase ? ` (${phase})` : ''}; retry later`,
          ),
        )
      }
      case 'stopping':
        return this.refuse(p, req, p.answers.stopping(name))
      case 'wake_failed':
        return this.refuse(p, req, p.answers.wakeFailed(name, reason))
    }
  }

  private refuse(p: ListenerPlan, req: PlanRequest, err: AppError): WireAction {
    p.books?.ended(err.status, performance.now() - req.startedAt)
    req.grant?.end(err.status, null)
    return { error: err }
  }

  /** lease: the backend counts the request until its end, recorded once (Lease). */
  private lease(
    b: Backend,
    model: string,
    req: PlanRequest,
    p: ListenerPlan,
    exclude: ReadonlySet<string> | undefined,
  ): WireAction {
    b.acquire()
    req.trace?.setAttributes({ 'gen_ai.response.model': b.model })
    // One object per request is both what the backend forwards and the handle it reports through.
    const lease = new Lease(this, b, model, req, p, exclude)
    const action = b.forward(lease, lease)
    return req.usage ? readingUsage(action, req.usage) : action
  }

  /** retry (a Lease's): its backend was unreachable before anything was sent: the next one, or `err` (Lease.next). */
  retry(
    b: Backend,
    model: string,
    req: PlanRequest,
    p: ListenerPlan,
    exclude: ReadonlySet<string> | undefined,
    err: AppError,
  ): WireAction {
    const tried = new Set(exclude)
    tried.add(b.key)
    if (this.candidates(model, p.kinds, tried).length > 0) return this.planOnce(model, req, p, null, tried)
    const info: ForwardEnd = {
      status: err.status,
      bytes: 0,
      durationMs: performance.now() - req.startedAt,
      ttftMs: null,
      streamed: false,
      aborted: false,
      error: err.code,
    }
    this.ended(b, model, req, p, info)
    return { error: err }
  }

  /**
   * ended (a Lease's): its request ended: announced once, for every counter that reads it, and told
   * to the listener's books and to the key (with the engine's token counts, when read).
   */
  ended(b: Backend, model: string, req: PlanRequest, p: ListenerPlan, info: ForwardEnd): void {
    const path = req.path
    if (this.requests.heard) this.announce(b, model, path, info)
    if (info.error && b.kind !== 'pod')
      this.log.warn('upstream failure', {
        backend: b.instanceId ?? b.key,
        path,
        status: info.status,
        error: info.error,
        ms: Math.round(info.durationMs),
      })
    p.books?.ended(info.status, info.durationMs)
    // What reached the client is charged, whether or not the engine's count came (usage.ts charged).
    req.grant?.end(info.status, charged(info, req.body.length))
  }

  private announce(b: Backend, model: string, path: string, info: ForwardEnd): void {
    const event: ProxyRequestEvent = {
      model,
      served: b.model,
      instance_id: b.instanceId ?? null,
      status: info.status,
      duration_ms: info.durationMs,
      ttft_ms: info.ttftMs,
      streamed: info.streamed,
      path,
    }
    // Set only when there is one (no spread of a fresh object on every request's end).
    const podId = b.podId
    if (podId) event.pod_id = podId
    if (info.error) event.error = info.error
    this.requests.emit(event)
  }
}

/**
 * Lease: one request leased to one backend, which counts it (acquire) until the lease ends once:
 * `end` when its response has ended (the backend's count released, the end announced, the
 * listener's books and the key told), or `next` when the backend could not be reached before
 * anything was sent (released, and the request planned again without it). It is also the request
 * as the backend forwards it (BackendRequest): its fields are the request's, named, not spread
 * (a spread would copy the plan's own fields too, on every request).
 */
class Lease implements LeaseHandle, BackendRequest {
  readonly path: string
  readonly enginePath: string
  readonly query: string
  readonly body: BodyRange
  readonly json: ScannedJson
  readonly firstByteTimeoutMs: number
  readonly connectTimeoutMs: number
  readonly holdTimeoutMs: number
  readonly trace: RequestTrace | null
  private over = false

  constructor(
    private readonly dir: ModelDirectory,
    private readonly b: Backend,
    readonly model: string,
    private readonly req: PlanRequest,
    private readonly p: ListenerPlan,
    private readonly exclude: ReadonlySet<string> | undefined,
  ) {
    this.path = req.path
    this.enginePath = req.enginePath
    this.query = req.query
    this.body = req.body
    this.json = req.json
    this.firstByteTimeoutMs = req.firstByteTimeoutMs
    this.connectTimeoutMs = req.connectTimeoutMs
    this.holdTimeoutMs = p.holdTimeoutMs
    this.trace = req.trace ?? null
  }

  /** end: the response ended (a forward's onEnd: bound, since a forward keeps it as a function). */
  readonly end = (info: ForwardEnd): void => {
    if (this.over) return
    this.over = true
    this.b.release()
    this.dir.ended(this.b, this.model, this.req, this.p, info)
  }

  next(reason: unknown): WireAction {
    if (this.over) return { error: reason as AppError }
    this.over = true
    this.b.release()
    return this.dir.retry(this.b, this.model, this.req, this.p, this.exclude, reason as AppError)
  }
}

const NONE: readonly Backend[] = []
const RESOLVED: Promise<void> = Promise.resolve()

/** WakeRun: one model's wake as requests started and joined it (ModelDirectory.join). */
interface WakeRun {
  /** How many requests asked for it (held or answered at once). */
  requests: number
  /** cancelled: every request left and its backend cancelled it (its end is no failure). */
  cancelled: boolean
  /** Settles with the wake: the model serves, or the wake failed. */
  done: Promise<void>
}

/**
 * seatOf: a request as a model's queue places it: its key's priority (none: normal) and, in a
 * bounded queue, its key's share of it (queueShare); a request without a key of its own is no party.
 */
function seatOf(req: PlanRequest, queue: { max: number } | null): Seat {
  const grant = req.grant
  const priority = grant?.priority ?? NORMAL_PRIORITY
  const party = grant?.party ?? null
  if (!party) return { priority, party: null, share: null }
  return { priority, party: party.id, share: queue ? queueShare(queue.max, party.maxConcurrent) : null }
}

/** wakeable: a backend of this readiness serves once its wake (or load) is over. */
function wakeable(r: Readiness): boolean {
  return r !== 'ready' && r !== 'unavailable'
}

/** taken: whether a backend is one of the listener's kinds and not excluded (already tried). */
function taken(
  b: Backend,
  kinds: ReadonlySet<BackendKind>,
  exclude: ReadonlySet<string> | undefined,
): boolean {
  return kinds.has(b.kind) && !exclude?.has(b.key)
}

/** allTaken: whether every backend of a source's list is taken (its list is then used as it is). */
function allTaken(
  list: readonly Backend[],
  kinds: ReadonlySet<BackendKind>,
  exclude: ReadonlySet<string> | undefined,
): boolean {
  for (let i = 0; i < list.length; i++) if (!taken(list[i]!, kinds, exclude)) return false
  return true
}

/**
 * withUsage: a granted request, made to ask the engine for its usage chunk when it streams one
 * (askForUsage: a splice of stream_options; `strip` when the client did not ask itself).
 */
function withUsage(req: PlanRequest): PlanRequest {
  if (!USAGE_STREAMS.has(req.path)) return { ...req, usage: 'read' }
  const asked = askForUsage(req.body, req.json)
  if (asked.body === req.body) return { ...req, usage: 'read' }
  return { ...req, body: asked.body, json: asked.json, usage: asked.strip ? 'strip' : 'read' }
}

/** readingUsage: a backend's action, with its forward (once decided) told to read usage. */
function readingUsage(action: WireAction, mode: UsageMode): WireAction {
  if ('forward' in action) {
    action.forward.usage = mode
    return action
  }
  if ('defer' in action) {
    const decide = action.defer
    return { defer: (signal) => decide(signal).then((next) => readingUsage(next, mode)) }
  }
  return action
}
