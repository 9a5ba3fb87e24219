import type {
  Address,
  Backend,
  BackendRequest,
  LeaseHandle,
  Readiness,
  SleepReason,
  SleepState,
} from '../../../src/directory/backend.ts'
import { engineCall, traced } from '../../../src/directory/trace.ts'
import type { SpanBase } from '../../../src/host/telemetry/spans.ts'
import { replaceModel } from '../../../src/wire/model-field.ts'
import type { WireAction } from '../../../src/wire/route.ts'

/**
 * InstanceHandle: what an instance backend reads of the engine instance behind it. The gateway's
 * ManagedInstance gives one (service.ts); a test's fake gateway gives its own.
 */
export interface InstanceHandle {
  readonly id: string
  readonly servedModelName: string
  readonly modelPath: string
  readonly baseUrl: string
  readiness(): Readiness
  inFlight(): number
  acquire(): void
  release(): void
  /**
   * wake: resolves once the instance serves again, or can no longer (failed, stopped: re-planned);
   * `trace`: the waiting request's span, the parent of the wake's.
   */
  wake(trace?: SpanBase | null): Promise<void>
  retryAfterSeconds?(): number | null
  sleepState(): SleepState | null
  queue?(): { max: number; timeoutMs: number } | null
  abandoned?(): boolean
  phase?(): string | null
  sleepable(): boolean
  sleep(level: 1 | 2, cancel: AbortSignal, why?: SleepReason): Promise<void>
  pinned?(): boolean
  health(
    timeoutMs: number,
    signal: AbortSignal,
  ): Promise<{ ok: true; seconds: number } | { ok: false; error: string }>
  address(): Address
  created(): number
  contextTokens?(): number | null
}

/**
 * InstanceBackend: a managed engine instance on this pod, as the directory sees it. It answers to
 * its served name, its id and its model path; the engine itself answers only to its served name,
 * so a request that names it otherwise has its `model` spliced (one JSON string, every other byte
 * as sent).
 */
export class InstanceBackend implements Backend {
  readonly kind = 'instance'
  readonly local = true

  constructor(private readonly h: InstanceHandle) {}

  get key(): string {
    return this.h.id
  }

  get instanceId(): string {
    return this.h.id
  }

  get model(): string {
    return this.h.servedModelName
  }

  /** names: whether a client's `model` names this instance (served name, id or model path). */
  names(model: string): boolean {
    const h = this.h
    return h.servedModelName === model || h.id === model || h.modelPath === model
  }

  readiness(): Readiness {
    return this.h.readiness()
  }

  inFlight(): number {
    return this.h.inFlight()
  }

  acquire(): void {
    this.h.acquire()
  }

  release(): void {
    this.h.release()
  }

  wake(trace?: SpanBase | null): Promise<void> {
    return this.h.wake(trace)
  }

  retryAfterSeconds(): number | null {
    return this.h.retryAfterSeconds?.() ?? null
  }

  sleepState(): SleepState | null {
    return this.h.sleepState()
  }

  queue(): { max: number; timeoutMs: number } | null {
    return this.h.queue?.() ?? null
  }

  abandoned(): boolean {
    return this.h.abandoned?.() ?? false
  }

  phase(): string | null {
    return this.h.phase?.() ?? null
  }

  sleepable(): boolean {
    return this.h.sleepable()
  }

  sleep(level: 1 | 2, cancel: AbortSignal, why?: SleepReason): Promise<void> {
    return this.h.sleep(level, cancel, why)
  }

  pinned(): boolean {
    return this.h.pinned?.() ?? false
  }

  health(timeoutMs: number, signal: AbortSignal) {
    return this.h.health(timeoutMs, signal)
  }

  address(): Address {
    return this.h.address()
  }

  created(): number {
    return this.h.created()
  }

  contextTokens(): number | null {
    return this.h.contextTokens?.() ?? null
  }

  forward(req: BackendRequest, lease: LeaseHandle): WireAction {
    const served = this.h.servedModelName
    const body = served && req.model !== served ? replaceModel(req.body, served, req.json) : req.body
    const forward = {
      origin: this.h.baseUrl,
      target: req.enginePath + req.query,
      body,
      firstByteTimeoutMs: req.firstByteTimeoutMs,
      connectTimeoutMs: req.connectTimeoutMs,
      // An engine that stopped after the plan (a move's source, an unload) refuses the connection:
      // the request goes to the next instance of the model, never answered 502 for it.
      retry: lease,
      onEnd: lease.end,
    }
    const trace = req.trace
    if (!trace) return { forward }
    const { host, port } = this.h.address()
    const call = engineCall(
      trace,
      { host, port, path: req.enginePath, model: served },
      { 'modelgate.instance_id': this.h.id },
    )
    return { forward: traced(call, forward) }
  }
}
