import { pause } from '../host/abortable.ts'

/**
 * engine-client is what every engine's control client shares, whatever the engine: the one HTTP
 * call with a deadline and the caller's signal (EngineHttp), the error classes, the health probe,
 * the /metrics reader, /v1/models, /tokenize, and the EngineClient interface the gateway, the router and the
 * benchmarks program against. Each engine kind (src/engine/kinds.ts) builds its own client on
 * EngineHttp for what differs: how it sleeps and wakes, and which metric names it exports.
 * Engines are addressed directly, never through an HTTP_PROXY from the environment.
 */
export class EngineCallError extends Error {
  constructor(
    message: string,
    /** the engine's HTTP status, or null when it gave no answer */
    readonly status: number | null,
  ) {
    super(message)
    this.name = 'EngineCallError'
  }
}

export interface CallOptions {
  /** deadline of this call in ms (each method has its own default) */
  timeoutMs?: number
  /** ends the call early; it then fails as the client's `abortedAs` says */
  signal?: AbortSignal
}

/**
 * ProbeOptions: a health probe may be told the engine sleeps (the caller's lifecycle knows it). An
 * engine whose health check runs a generation must then be probed another way (SGLang's /health
 * runs one token through its scheduler, on memory a release has unmapped); vLLM ignores it.
 */
export interface ProbeOptions extends CallOptions {
  asleep?: boolean
}

export interface EngineClientOptions {
  /** what a call ended by its signal is reported as (e.g. "the router is stopping") */
  abortedAs?: string
}

/**
 * SleepMode is what happens to requests running on the engine when it falls asleep, where the
 * engine lets the caller choose (vLLM's `/sleep?mode=`): `abort` cuts them, `wait` lets them finish
 * first, `keep` pauses them until the wake. Engines without the choice ignore it.
 */
export type SleepMode = 'abort' | 'wait' | 'keep'

/** SleepTag: a part of the engine a partial wake can wake on its own (the gateway's vocabulary). */
export type SleepTag = 'weights' | 'kv_cache'

/** WakePhase: one step of a wake, named by the engine's driver (its `wakePhases`). */
export type WakePhase = string

/** WakeOutcome: the phases that ran, in order, and whether the engine still sleeps (some tags left). */
export interface WakeOutcome {
  phases: WakePhase[]
  sleeping: boolean
}

/** WakeOptions: the phases an earlier wake since the same sleep finished, and who hears each phase. */
export interface WakeOptions extends CallOptions {
  done?: readonly WakePhase[]
  onPhase?: (phase: WakePhase) => void
}

/**
 * WakeError: a wake stopped at `phase` after `done` finished. The engine is then half awake (after
 * a level-2 sleep: possibly with weights it must not serve from); the caller keeps it out of service.
 */
export class WakeError extends EngineCallError {
  constructor(
    message: string,
    status: number | null,
    /** the phase that failed; `is_sleeping` when only the final confirmation read did */
    readonly phase: WakePhase | 'is_sleeping',
    readonly done: WakePhase[],
  ) {
    super(message, status)
    this.name = 'WakeError'
  }
}

/** HealthProbe: a /health answer with its round trip, or why there was none. */
export type HealthProbe = { ok: true; seconds: number } | { ok: false; error: string }

export interface Tokenized {
  count: number
  /** max_model_len as the engine reported it, when it did */
  maxModelLen: number | null
}

/** EngineUsage: what an engine's /metrics says of its work; null for a figure it does not export. */
export interface EngineUsage {
  generationTokens: number | null
  promptTokens: number | null
  kvCacheUsage: number | null
}

/**
 * EngineClient: the control calls the gateway, the router and the benchmarks make on an engine,
 * whatever its kind. `sleepMode` is whether the engine has sleep mode as its answers showed (null
 * until known).
 */
export interface EngineClient {
  readonly baseUrl: string
  readonly sleepMode: boolean | null
  /** probe: the engine's health check; 200 is healthy, with the round trip. Never throws. */
  probe(o?: ProbeOptions): Promise<HealthProbe>
  /** health: true when the probe says healthy. */
  health(timeoutMs?: number, o?: { signal?: AbortSignal; asleep?: boolean }): Promise<boolean>
  /** sleep puts the engine to sleep at `level`; returns the mode it was sent with (null: none). */
  sleep(level: 1 | 2, o?: CallOptions & { mode?: SleepMode }): Promise<SleepMode | null>
  /** wakeUp wakes an engine that sleeps at `level` (every part, or `tags`), phase by phase. */
  wakeUp(level: 1 | 2, tags?: readonly SleepTag[], o?: WakeOptions): Promise<WakeOutcome>
  /** isSleeping: the engine's own view; throws EngineCallError when it cannot tell. */
  isSleeping(o?: CallOptions): Promise<boolean>
  /** sleepLevel: the level the engine says it sleeps at (0 awake), null when it does not say. */
  sleepLevel(o?: CallOptions): Promise<0 | 1 | 2 | null>
  /**
   * drainedSleepMode: the `mode` to send with a sleep once the gateway has drained its own
   * requests (see plugins/gateway/README.md, "Sleep and wake"); absent: `wait`.
   */
  drainedSleepMode?(o?: CallOptions): Promise<SleepMode>
  /** kvCacheUsage: the share of the KV cache in use (0–1) from the engine's /metrics, null when absent. */
  kvCacheUsage(o?: CallOptions): Promise<number | null>
  /** metric reads one gauge from /metrics (the first of `names` found, summed over label sets). */
  metric(names: string[], o?: CallOptions): Promise<number | null>
  /** metrics reads several gauges from one GET /metrics: per group of names, the first present. */
  metrics(groups: string[][], o?: CallOptions): Promise<(number | null)[]>
  /** usage: the engine's token counters and KV-cache use, under its own metric names (one GET). */
  usage(o?: CallOptions): Promise<EngineUsage>
  /** servedModels: the model ids `GET /v1/models` lists (every served name of the engine). */
  servedModels(o?: CallOptions): Promise<string[]>
  /** tokenize: the prompt's length by the engine's tokenizer; null when it has no /tokenize. */
  tokenize(model: string, prompt: string, o?: CallOptions): Promise<Tokenized | null>
}

/**
 * engineOrigin: the base URL of an engine listening on host:port, as a local client reaches it.
 * A wildcard address is reached on loopback (0.0.0.0 → 127.0.0.1, :: → [::1]); an IPv6 address is
 * bracketed once.
 */
export function engineOrigin(host: string, port: number): string {
  let h = host
  if (h === '0.0.0.0') h = '127.0.0.1'
  else if (h === '::' || h === '[::]') h = '[::1]'
  else if (h.includes(':') && !h.startsWith('[')) h = `[${h}]`
  return `http://${h}:${port}`
}

/** Statuses meaning the engine has no /tokenize at all. */
const NO_TOKENIZE = new Set([404, 405, 501])

/**
 * EngineHttp is the transport every engine client is built on: `send` makes one call and returns
 * the engine's answer, whatever its status, or why there was none; `answer` throws EngineCallError
 * when there was none; `call` also throws on anything but 2xx. `observe` lets a client learn from
 * each answer (vLLM learns whether it has sleep mode).
 */
export abstract class EngineHttp {
  constructor(
    readonly baseUrl: string,
    protected readonly timeoutMs = 10000,
    private readonly opts: EngineClientOptions = {},
  ) {}

  /** observe hears every answer the engine gave (status and path). */
  protected observe(_path: string, _res: Response): void {}

  protected async send(
    method: string,
    path: string,
    o: CallOptions,
    defaultMs: number,
    body?: string,
  ): Promise<Response | { failure: string }> {
    const timeoutMs = o.timeoutMs ?? defaultMs
    const deadline = AbortSignal.timeout(timeoutMs)
    const init: BunFetchRequestInit = {
      method,
      signal: o.signal ? AbortSignal.any([deadline, o.signal]) : deadline,
      proxy: false,
    }
    if (body !== undefined) {
      init.body = body
      init.headers = { 'content-type': 'application/json' }
    }
    let res: Response
    try {
      res = await fetch(`${this.baseUrl}${path}`, init)
    } catch (err) {
      return { failure: this.describeFailure(err, timeoutMs) }
    }
    this.observe(path, res)
    return res
  }

  private describeFailure(err: unknown, timeoutMs: number): string {
    const e = err as { name?: string; code?: string; message?: string }
    if (e?.name === 'TimeoutError') return `no answer within ${timeoutMs} ms`
    if (e?.name === 'AbortError') return this.opts.abortedAs ?? 'the call was cancelled'
    if (e?.code === 'ConnectionRefused' || e?.code === 'ECONNREFUSED') return 'connection refused'
    return e?.code ?? e?.message ?? 'connection failed'
  }

  /** answer: send, where no answer throws EngineCallError. */
  protected async answer(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    const res = await this.send(method, path, o, defaultMs, body)
    if ('failure' in res) throw new EngineCallError(`engine ${method} ${path} failed: ${res.failure}`, null)
    return res
  }

  /** call: answer, where anything but 2xx throws EngineCallError with the start of the body. */
  protected async call(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    return requireOk(await this.answer(method, path, o, defaultMs, body), method, path)
  }

  /** probePath: the GET whose 200 means healthy (a subclass may choose another one while asleep). */
  protected probePath(_o: ProbeOptions): string {
    return '/health'
  }

  /** probe: GET the health path; 200 is healthy, with the round trip in seconds. Never throws. */
  async probe(o: ProbeOptions = {}): Promise<HealthProbe> {
    const path = this.probePath(o)
    const t0 = performance.now()
    const res = await this.send('GET', path, o, 2000)
    if ('failure' in res) return { ok: false, error: res.failure }
    await res.body?.cancel()
    if (res.status === 200) return { ok: true, seconds: (performance.now() - t0) / 1000 }
    return { ok: false, error: `engine ${path} answered ${res.status}` }
  }

  /** health: true on 200, false on anything else (including connection refused). */
  async health(timeoutMs = 2000, o: { signal?: AbortSignal; asleep?: boolean } = {}): Promise<boolean> {
    return (await this.probe({ timeoutMs, signal: o.signal, asleep: o.asleep })).ok
  }

  /** metrics: the engine's /metrics text. */
  protected async metricsText(o: CallOptions): Promise<string> {
    return (await this.call('GET', '/metrics', o, 3000)).text()
  }

  /** metric reads one gauge from the engine's /metrics (summed over label sets), or null. */
  async metric(names: string[], o: CallOptions = {}): Promise<number | null> {
    return readGauge(await this.metricsText(o), names)
  }

  /**
   * metrics reads several figures from one GET /metrics: for each group of names (a current one and
   * its older spellings), the first name present, summed over its label sets; null when none is.
   */
  async metrics(groups: string[][], o: CallOptions = {}): Promise<(number | null)[]> {
    const text = await this.metricsText(o)
    return groups.map((names) => readGauge(text, names))
  }

  /** servedModels: the model ids `GET /v1/models` lists (every served name of the engine). */
  async servedModels(o: CallOptions = {}): Promise<string[]> {
    const body = (await (await this.call('GET', '/v1/models', o, 5000)).json().catch(() => null)) as {
      data?: unknown
    } | null
    if (!Array.isArray(body?.data))
      throw new EngineCallError('engine GET /v1/models answered without a model list', 200)
    return body.data.map((m: { id?: unknown }) => String(m?.id ?? ''))
  }

  /**
   * tokenize: POST /tokenize, the prompt's length as the engine's own tokenizer counts it; null
   * when the engine has no /tokenize (404, 405 or 501).
   */
  async tokenize(model: string, prompt: string, o: CallOptions = {}): Promise<Tokenized | null> {
    const body = JSON.stringify({ model, prompt })
    const res = await this.answer('POST', '/tokenize', o, this.timeoutMs, body)
    if (NO_TOKENIZE.has(res.status)) {
      await res.body?.cancel()
      return null
    }
    const r = (await (await requireOk(res, 'POST', '/tokenize')).json()) as {
      count?: unknown
      tokens?: unknown
      max_model_len?: unknown
    }
    const count = typeof r.count === 'number' ? r.count : Array.isArray(r.tokens) ? r.tokens.length : null
    if (count === null)
      throw new EngineCallError('engine POST /tokenize answered without a count', res.status)
    return { count, maxModelLen: typeof r.max_model_len === 'number' ? r.max_model_len : null }
  }
}

/**
 * readGauge: the value of the first of `names` in a Prometheus text exposition, summed over its
 * label sets; null when none is there.
 */
export function readGauge(text: string, names: readonly string[]): number | null {
  for (const name of names) {
    let sum = 0
    let seen = false
    for (const line of text.split('\n')) {
      if (!line.startsWith(name)) continue
      const rest = line.slice(name.length)
      if (rest[0] !== ' ' && rest[0] !== '{') continue
      const v = Number(line.slice(line.lastIndexOf(' ') + 1))
      if (Number.isFinite(v)) {
        sum += v
        seen = true
      }
    }
    if (seen) return sum
  }
  return null
}

/** requireOk passes a 2xx answer; anything else throws EngineCallError with the start of the body. */
export async function requireOk(res: Response, method: string, path: string): Promise<Response> {
  if (res.ok) return res
  const text = (await res.text().catch(() => '')).slice(0, 300)
  throw new EngineCallError(
    `engine ${method} ${path} answered ${res.status}${text ? `: ${text}` : ''}`,
    res.status,
  )
}

/**
 * waitHealthy polls the health check with exponential backoff until 200, `stop()` says give up,
 * `signal` aborts, or the deadline. `probeMs` caps each probe's own deadline (default 2000).
 */
export async function waitHealthy(
  client: Pick<EngineClient, 'health'>,
  opts: {
    initialMs: number
    maxMs: number
    deadlineMs: number
    stop?: () => boolean
    probeMs?: number
    signal?: AbortSignal
  },
): Promise<'healthy' | 'stopped' | 'timeout'> {
  const { signal } = opts
  const stopped = () => opts.stop?.() === true || signal?.aborted === true
  const until = Date.now() + opts.deadlineMs
  let delay = opts.initialMs
  while (Date.now() < until) {
    if (stopped()) return 'stopped'
    const probeMs = Math.min(opts.probeMs ?? 2000, Math.max(200, until - Date.now()))
    if (await client.health(probeMs, { signal })) return 'healthy'
    if (stopped()) return 'stopped'
    await pause(Math.min(delay, Math.max(0, until - Date.now())), signal)
    delay = Math.min(opts.maxMs, Math.round(delay * 1.5))
  }
  return 'timeout'
}
