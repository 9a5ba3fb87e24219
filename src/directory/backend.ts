import type { RequestTrace, SpanBase } from '../host/telemetry/spans.ts'
import type { BodyRange } from '../wire/body-range.ts'
import type { ScannedJson } from '../wire/json-scan.ts'
import type { ForwardEnd, WireAction } from '../wire/route.ts'

/**
 * A backend is one place a request for a model can be served: a managed engine instance on this
 * pod (the gateway's), an external engine configured by name (the router's endpoints), or another
 * pod of the cluster that serves the model (the cluster's). Each kind implements this one small
 * interface where its owner lives; the directory (directory.ts) picks among them, counts the
 * requests each holds and wakes the ones that sleep. Nothing else decides where a request goes.
 */
export type BackendKind = 'instance' | 'endpoint' | 'pod'

/**
 * Readiness: what a backend can do with a request now.
 * - ready: it takes requests;
 * - asleep: it sleeps, or is falling asleep, and a request may wake it (its wake runs next);
 * - waking: its wake is under way;
 * - starting: it is loading (not a request's to speed up);
 * - absent: not loaded here, but a request may load it (a catalogued model: its `wake` loads it);
 * - unavailable: it cannot serve (failed, stopping, moving out of routing).
 */
export type Readiness = 'ready' | 'asleep' | 'waking' | 'starting' | 'absent' | 'unavailable'

/**
 * SleepState: how a backend sleeps, as the router's views and its idle rule read it: `active` also
 * while a sleep still drains (it serves until it sleeps), `waking` while its wake runs.
 */
/** SleepReason: why a backend is put to sleep. */
export type SleepReason = 'operator' | 'idle'

export interface SleepState {
  status: 'active' | 'sleeping' | 'waking'
  /** Epoch ms it fell asleep (null while active or not known). */
  since: number | null
  level: 1 | 2 | null
  /** The sleep or wake under way (null: none). */
  operation: 'sleep' | 'wake' | null
}

/** Address: where the engine of a backend listens (what the router's model list shows). */
export interface Address {
  host: string
  port: number
}

export interface Backend {
  readonly kind: BackendKind
  /** key: unique in the directory (an instance id, `endpoint:<name>`, `pod:<pod id>:<model>`). */
  readonly key: string
  /** model: the served model name this backend answers to (the directory's key for it). */
  readonly model: string
  /** local: on this pod (an instance or a configured endpoint), not another pod. */
  readonly local: boolean
  /** instanceId (an instance) or podId (another pod): what a request's record names. */
  readonly instanceId?: string
  readonly podId?: string
  readiness(): Readiness
  /** inFlight: the requests this backend holds now (its leases), the one count of them. */
  inFlight(): number
  /** acquire / release: one request begins, or ends (once per acquire). */
  acquire(): void
  release(): void
  /** failedRecently: a pod that refused or timed a connection lately goes last. */
  failedRecently?(): boolean
  /**
   * retryAfterSeconds: how long until it serves, as the backend itself can tell before any wake of
   * it was measured (e.g. from its size); null: it cannot tell.
   */
  retryAfterSeconds?(): number | null
  /**
   * queue: requests for it wait in a bounded queue while it loads or wakes, whatever the
   * listener's wake_on_request (a model served on demand: its residency settings); null: they don't.
   */
  queue?(): { max: number; timeoutMs: number } | null
  /**
   * abandoned: every request waiting for it left (a load only they asked for may be cancelled).
   * True when it cancelled the load under way: its wake then ends without serving, which is no
   * failure of the model (the next request starts a load again).
   */
  abandoned?(): boolean
  /** phase: what its load or wake is doing now, for a refusal's message (null: nothing to say). */
  phase?(): string | null
  /** sleepState: its sleep as the router's views show it (local backends); null while it neither serves nor sleeps (loading, failed, stopping). */
  sleepState?(): SleepState | null
  /** sleepable: whether it has a sleep mode (null: not known yet). */
  sleepable?(): boolean | null
  /**
   * sleep puts it to sleep without cutting a request (it drains first); `cancel` ends a sleep that
   * still drains (a request wants it), ignored once the engine was asked to sleep. `why`: an
   * operator asked, or it was idle too long (the router's auto-sleep: a rule of the host's
   * residency manager where it has one, which records it as one of its decisions).
   */
  sleep?(level: 1 | 2, cancel: AbortSignal, why?: SleepReason): Promise<void>
  /** pinned: the host keeps it resident (a pinned catalogue entry): never slept for idleness. */
  pinned?(): boolean
  /** health probes its engine (the router's health routes). */
  health?(
    timeoutMs: number,
    signal: AbortSignal,
  ): Promise<{ ok: true; seconds: number } | { ok: false; error: string }>
  /** address: where its engine listens. */
  address?(): Address
  /** created: when it started serving (Unix seconds), for OpenAI's `created`. */
  created?(): number
  /** contextTokens: the engine's context length in tokens (a request's worst case without max_tokens); null: not known. */
  contextTokens?(): number | null
  /**
   * wake starts this backend's one wake or joins the one under way (a request, an operator and the
   * router all join the same); it resolves once the backend takes requests. Absent: not wakeable
   * from here (another pod wakes its own). `trace`: the span of the request waiting for it, under
   * which the wake's own span goes (or, when it joins a wake under way, an event says so).
   */
  wake?(trace?: SpanBase | null): Promise<void>
  /**
   * forward: the action that carries a leased request to this backend. `lease.end` must be called
   * exactly once when the response has ended (a forward's onEnd), and `lease.next` gives the next
   * candidate's action when this backend turns out unreachable before anything was sent.
   */
  forward(req: BackendRequest, lease: LeaseHandle): WireAction
}

/** BackendRequest: what a backend's forward needs of the request. */
export interface BackendRequest {
  /** The model as the client named it (an instance id, a served name, a model path). */
  readonly model: string
  /** The listener's path (e.g. `/v1/chat/completions`, `/classification`) and the engine's for it. */
  readonly path: string
  readonly enginePath: string
  /** '' or '?…'. */
  readonly query: string
  readonly body: BodyRange
  /** The body's scan (its top-level fields located), for a splice of `model`. */
  readonly json: ScannedJson
  readonly firstByteTimeoutMs: number
  readonly connectTimeoutMs: number
  /** The listener's hold_timeout (ms): how long a pod it is relayed to may hold it for a wake. */
  readonly holdTimeoutMs: number
  /**
   * trace: the request's server span (null or absent: not traced). A backend's forward puts its
   * call (to an engine, or the hop to a pod) under it as a client span, and sends that span's
   * `traceparent` in place of the client's (traceCall, trace.ts).
   */
  readonly trace?: RequestTrace | null
}

/** LeaseHandle: what a backend's forward reports back through. */
export interface LeaseHandle {
  /** end: the response has ended (releases the backend's count, records the request). */
  end(info: ForwardEnd): void
  /**
   * next: this backend could not be reached before anything was sent (counted, marked failed): the
   * lease ends and the request goes to the next candidate, in the directory's order; an error action
   * when none is left.
   */
  next(reason: unknown): WireAction
}
