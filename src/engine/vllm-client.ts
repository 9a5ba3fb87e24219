import { pause } from '../host/abortable.ts'

/**
 * VllmClient is the one client of an engine's HTTP endpoints other than inference: /health,
 * /v1/models, /sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache, /metrics and
 * /tokenize, and vLLM's wake sequence after a level-2 sleep (`wakeUp`). The gateway, the router and the
 * benchmarks' prompt builder all use it. Every call has a deadline, so a hung engine never hangs a
 * request of ours, and may also take the caller's AbortSignal (the router's calls end when it
 * stops). Engines are addressed directly, never through an HTTP_PROXY from the environment.
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

export interface VllmClientOptions {
  /** what a call ended by its signal is reported as (e.g. "the router is stopping") */
  abortedAs?: string
}

/**
 * SleepMode is vLLM's `/sleep?mode=`: what happens to requests running on the engine when it falls
 * asleep. `abort` (vLLM's default) cuts them, `wait` lets them finish first, `keep` pauses them
 * until the wake. Engines older than the parameter ignore it (they have no such choice).
 */
export type SleepMode = 'abort' | 'wait' | 'keep'

/** SleepTag: a part of the engine `/wake_up?tags=` can wake on its own. */
export type SleepTag = 'weights' | 'kv_cache'

/**
 * WakePhase: one step of a wake. After level 1 a plain `/wake_up` (or `/wake_up?tags=` of the tags
 * asked for) restores everything. After level 2 the weights are gone, so vLLM's documented
 * sequence runs: `weights` (wake that tag), `reload_weights` (`POST /collective_rpc
 * {"method":"reload_weights"}`), `kv_cache` (wake that tag), and once the engine is fully awake
 * `reset_prefix_cache` (the prefix cache must not point at blocks whose content is gone).
 */
export type WakePhase = 'wake_up' | 'weights' | 'reload_weights' | 'kv_cache' | 'reset_prefix_cache'

/** WakeOutcome: the phases that ran, in order, and whether the engine still sleeps (some tags left). */
export interface WakeOutcome {
  phases: WakePhase[]
  sleeping: boolean
}

/**
 * WakeError: a wake stopped at `phase` after `done` finished. The engine is then half awake (after
 * level 2: possibly with weights it must not serve from); the caller keeps it out of service.
 */
export class WakeError extends EngineCallError {
  constructor(
    message: string,
    status: number | null,
    /** the phase that failed; `is_sleeping` when only the final `/is_sleeping` read did */
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

/** The sleep-mode endpoints: a 404 on one of them means the engine runs without sleep mode. */
const SLEEP_PATH = /^\/(sleep|wake_up|is_sleeping)(\?|$)/
/**
 * MODE_REFUSED: an error body that names the `mode` parameter (FastAPI's 422 `loc`, a ValueError). vLLM
 * hands `mode` to its engine core, whose `Invalid pause mode: …` comes back as a 500 (`Call to sleep
 * method failed: …`); the other statuses are a 400 or 422 from a build that validates the parameter.
 */
const MODE_REFUSED = /["'`]mode["'`]|\bmode=|invalid (sleep |pause )?mode|PauseMode/i
const MODE_REFUSED_STATUS = new Set([400, 422, 500])
/** Statuses meaning the engine has no /tokenize at all. */
const NO_TOKENIZE = new Set([404, 405, 501])

export class VllmClient {
  /**
   * sleepMode: whether the engine has sleep mode, as its answers on the sleep endpoints showed
   * (null: not known yet; false after a 404 there).
   */
  sleepMode: boolean | null = null

  /**
   * sleepModeParam: false once the engine refused `/sleep?mode=` (it is then sent without it);
   * true once an engine answered 2xx to it (a build older than the parameter ignores it silently).
   */
  sleepModeParam: boolean | null = null

  constructor(
    readonly baseUrl: string,
    private readonly timeoutMs = 10000,
    private readonly opts: VllmClientOptions = {},
  ) {}

  /**
   * send makes one call and returns the engine's answer, whatever its status, or why there was
   * none. Answers on the sleep endpoints teach `sleepMode`.
   */
  private async send(
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
    if (SLEEP_PATH.test(path)) {
      if (res.status === 404) this.sleepMode = false
      else if (res.ok) this.sleepMode = true
    }
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
  private async answer(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    const res = await this.send(method, path, o, defaultMs, body)
    if ('failure' in res) throw new EngineCallError(`engine ${method} ${path} failed: ${res.failure}`, null)
    return res
  }

  /** call: answer, where anything but 2xx throws EngineCallError with the start of the body. */
  private async call(method: string, path: string, o: CallOptions, defaultMs: number, body?: string) {
    return requireOk(await this.answer(method, path, o, defaultMs, body), method, path)
  }

  /** probe: GET /health; 200 is healthy, with the round trip in seconds. Never throws. */
  async probe(o: CallOptions = {}): Promise<HealthProbe> {
    const t0 = performance.now()
    const res = await this.send('GET', '/health', o, 2000)
    if ('failure' in res) return { ok: false, error: res.failure }
    await res.body?.cancel()
    if (res.status === 200) return { ok: true, seconds: (performance.now() - t0) / 1000 }
    return { ok: false, error: `engine /health answered ${res.status}` }
  }

  /** health: true on 200, false on anything else (including connection refused). */
  async health(timeoutMs = 2000, o: { signal?: AbortSignal } = {}): Promise<boolean> {
    return (await this.probe({ timeoutMs, signal: o.signal })).ok
  }

  /**
   * sleep: `POST /sleep?level=L[&mode=M]`. Returns the mode that was sent: null without one, or when
   * the engine refused the parameter (a 400/422/500 naming it: nothing slept; the call is then made
   * once without it, and later calls leave it out).
   */
  async sleep(level: 1 | 2, o: CallOptions & { mode?: SleepMode } = {}): Promise<SleepMode | null> {
    const mode = o.mode && this.sleepModeParam !== false ? o.mode : null
    const path = `/sleep?level=${level}${mode ? `&mode=${mode}` : ''}`
    const res = await this.answer('POST', path, o, 120000)
    if (mode && MODE_REFUSED_STATUS.has(res.status)) {
      const text = await res.text().catch(() => '')
      if (MODE_REFUSED.test(text)) {
        this.sleepModeParam = false
        return this.sleep(level, { ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}), signal: o.signal })
      }
      throw new EngineCallError(
        `engine POST ${path} answered ${res.status}: ${text.slice(0, 300)}`,
        res.status,
      )
    }
    await (await requireOk(res, 'POST', path)).body?.cancel()
    if (mode) this.sleepModeParam = true
    return mode
  }

  /** wake: one `POST /wake_up[?tags=…]` (no tags: every part). See wakeUp for a whole wake. */
  async wake(tags: string[] = [], o: CallOptions = {}): Promise<void> {
    const q = tags.map((t) => `tags=${encodeURIComponent(t)}`).join('&')
    await (await this.call('POST', `/wake_up${q ? `?${q}` : ''}`, o, 300000)).body?.cancel()
  }

  /**
   * collectiveRpc: `POST /collective_rpc {method, args?, kwargs?, timeout?}` (dev mode), run on
   * every worker. Returns the workers' results, or null when the engine answered without a body.
   */
  async collectiveRpc(
    method: string,
    body: { args?: string[]; kwargs?: Record<string, string>; timeout?: number } = {},
    o: CallOptions = {},
  ): Promise<unknown[] | null> {
    const res = await this.call('POST', '/collective_rpc', o, 600000, JSON.stringify({ method, ...body }))
    const text = await res.text()
    if (!text) return null
    const parsed = JSON.parse(text) as { results?: unknown }
    return Array.isArray(parsed.results) ? parsed.results : null
  }

  /**
   * resetPrefixCache: `POST /reset_prefix_cache`. Newer builds answer `{success}` (false while
   * blocks are still held); older ones answer 200 with no body, taken as success.
   */
  async resetPrefixCache(o: CallOptions = {}): Promise<boolean> {
    const text = await (await this.call('POST', '/reset_prefix_cache', o, 30000)).text()
    if (!text) return true
    try {
      return (JSON.parse(text) as { success?: unknown }).success !== false
    } catch {
      return true
    }
  }

  /**
   * wakeUp wakes an engine that sleeps at `level`: every part, or only `tags`. After level 1, one
   * `/wake_up` (or one per tag asked for). After level 2, vLLM's sequence (see WakePhase): the
   * weights tag, reload_weights, the kv_cache tag, then, once `/is_sleeping` says the engine is
   * fully awake, the prefix cache reset. `done` lists the phases an earlier wake since the same
   * sleep finished (a partial wake, or one that failed half-way): they are not run again (waking a
   * part that is awake remaps memory vLLM already mapped). `onPhase` hears each phase as it
   * finishes. A failing phase throws WakeError naming it and the phases this call finished.
   */
  async wakeUp(
    level: 1 | 2,
    tags: readonly SleepTag[] = [],
    o: CallOptions & { done?: readonly WakePhase[]; onPhase?: (phase: WakePhase) => void } = {},
  ): Promise<WakeOutcome> {
    const done = new Set<WakePhase>(o.done ?? [])
    const phases: WakePhase[] = []
    const call = { signal: o.signal, ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}) }
    const step = async (phase: WakePhase, run: () => Promise<unknown>) => {
      try {
        await run()
      } catch (err) {
        const status = err instanceof EngineCallError ? err.status : null
        const after = phases.length ? ` after ${phases.join(', ')}` : ''
        throw new WakeError(`wake failed at ${phase}${after}: ${(err as Error).message}`, status, phase, [
          ...phases,
        ])
      }
      phases.push(phase)
      done.add(phase)
      o.onPhase?.(phase)
    }
    const awake = (t: SleepTag) => done.has(t) || done.has('wake_up')
    const want = (tags.length ? tags : (['weights', 'kv_cache'] as const)).filter((t) => !awake(t))
    if (level === 1) {
      if (want.length === 2) await step('wake_up', () => this.wake([], call))
      else for (const t of want) await step(t, () => this.wake([t], call))
    } else {
      if (want.includes('weights')) await step('weights', () => this.wake(['weights'], call))
      // Weights woken after level 2 hold garbage until reloaded, whichever call woke them.
      if (awake('weights') && !done.has('reload_weights'))
        await step('reload_weights', () => this.collectiveRpc('reload_weights', {}, call))
      if (want.includes('kv_cache')) await step('kv_cache', () => this.wake(['kv_cache'], call))
    }
    let sleeping: boolean
    try {
      sleeping = await this.isSleeping(call)
    } catch (err) {
      const status = err instanceof EngineCallError ? err.status : null
      const msg = `wake could not be confirmed (GET /is_sleeping): ${(err as Error).message}`
      throw new WakeError(msg, status, 'is_sleeping', phases)
    }
    if (level === 2 && !sleeping && !done.has('reset_prefix_cache'))
      await step('reset_prefix_cache', async () => {
        if (!(await this.resetPrefixCache(call))) throw new Error('the engine answered {"success": false}')
      })
    return { phases, sleeping }
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

  async isSleeping(o: CallOptions = {}): Promise<boolean> {
    const body = (await (await this.call('GET', '/is_sleeping', o, 5000)).json()) as { is_sleeping?: unknown }
    return body.is_sleeping === true
  }

  /**
   * sleepLevel: what newer builds' `vllm:engine_sleep_state{sleep_state=…}` gauge says: 0 awake,
   * 1 `weights_offloaded`, 2 `discard_all`; null when the engine does not export it.
   */
  async sleepLevel(o: CallOptions = {}): Promise<0 | 1 | 2 | null> {
    const text = await (await this.call('GET', '/metrics', o, 3000)).text()
    const levels: Record<string, 0 | 1 | 2> = { awake: 0, weights_offloaded: 1, discard_all: 2 }
    for (const line of text.split('\n')) {
      if (!line.startsWith('vllm:engine_sleep_state{')) continue
      const state = /sleep_state="([^"]*)"/.exec(line)?.[1]
      const level = state === undefined ? undefined : levels[state]
      if (level !== undefined && Number(line.slice(line.lastIndexOf(' ') + 1)) >= 1) return level
    }
    return null
  }

  /** metric reads one gauge from the engine's /metrics (summed over label sets), or null. */
  async metric(names: string[], o: CallOptions = {}): Promise<number | null> {
    return (await this.metrics([names], o))[0] ?? null
  }

  /**
   * metrics reads several figures from one GET /metrics: for each group of names (a current one and
   * its older spellings), the first name present, summed over its label sets; null when none is.
   */
  async metrics(groups: string[][], o: CallOptions = {}): Promise<(number | null)[]> {
    const text = await (await this.call('GET', '/metrics', o, 3000)).text()
    const lines = text.split('\n')
    return groups.map((names) => {
      for (const name of names) {
        let sum = 0
        let seen = false
        for (const line of lines) {
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
    })
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

/** requireOk passes a 2xx answer; anything else throws EngineCallError with the start of the body. */
async function requireOk(res: Response, method: string, path: string): Promise<Response> {
  if (res.ok) return res
  const text = (await res.text().catch(() => '')).slice(0, 300)
  throw new EngineCallError(
    `engine ${method} ${path} answered ${res.status}${text ? `: ${text}` : ''}`,
    res.status,
  )
}

/**
 * waitHealthy polls /health with exponential backoff until 200, `stop()` says give up, `signal`
 * aborts, or the deadline. `probeMs` caps each probe's own deadline (default 2000).
 */
export async function waitHealthy(
  client: Pick<VllmClient, 'health'>,
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
