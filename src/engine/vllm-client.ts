import {
  type CallOptions,
  EngineCallError,
  type EngineClient,
  EngineHttp,
  type EngineUsage,
  readGauge,
  requireOk,
  type SleepMode,
  type SleepTag,
  WakeError,
  type WakeOptions,
  type WakeOutcome,
} from './engine-client.ts'

/**
 * VllmClient is vLLM's control client (the vLLM driver's, src/engine/vllm-driver.ts): /health,
 * /sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache, /metrics and /tokenize, and
 * vLLM's wake sequence after a level-2 sleep (`wakeUp`). The transport (deadlines, the caller's
 * signal, no HTTP_PROXY) is EngineHttp's.
 */

/**
 * VllmWakePhase: one step of a vLLM wake. After level 1 a plain `/wake_up` (or `/wake_up?tags=` of
 * the tags asked for) restores everything. After level 2 the weights are gone, so vLLM's documented
 * sequence runs: `weights` (wake that tag), `reload_weights` (`POST /collective_rpc
 * {"method":"reload_weights"}`), `kv_cache` (wake that tag), and once the engine is fully awake
 * `reset_prefix_cache` (the prefix cache must not point at blocks whose content is gone).
 */
export type VllmWakePhase = 'wake_up' | 'weights' | 'reload_weights' | 'kv_cache' | 'reset_prefix_cache'

export const VLLM_WAKE_PHASES: readonly VllmWakePhase[] = [
  'wake_up',
  'weights',
  'reload_weights',
  'kv_cache',
  'reset_prefix_cache',
]

/** The sleep-mode endpoints: a 404 on one of them means the engine runs without sleep mode. */
const SLEEP_PATH = /^\/(sleep|wake_up|is_sleeping)(\?|$)/
/**
 * MODE_REFUSED: an error body that names the `mode` parameter (FastAPI's 422 `loc`, a ValueError). vLLM
 * hands `mode` to its engine core, whose `Invalid pause mode: …` comes back as a 500 (`Call to sleep
 * method failed: …`); the other statuses are a 400 or 422 from a build that validates the parameter.
 */
const MODE_REFUSED = /["'`]mode["'`]|\bmode=|invalid (sleep |pause )?mode|PauseMode/i
const MODE_REFUSED_STATUS = new Set([400, 422, 500])
const KV_USAGE = ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc']

export class VllmClient extends EngineHttp implements EngineClient {
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

  /** observe: answers on the sleep endpoints teach `sleepMode`. */
  protected override observe(path: string, res: Response): void {
    if (SLEEP_PATH.test(path)) {
      if (res.status === 404) this.sleepMode = false
      else if (res.ok) this.sleepMode = true
    }
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
   * `/wake_up` (or one per tag asked for). After level 2, vLLM's sequence (see VllmWakePhase): the
   * weights tag, reload_weights, the kv_cache tag, then, once `/is_sleeping` says the engine is
   * fully awake, the prefix cache reset. `done` lists the phases an earlier wake since the same
   * sleep finished (a partial wake, or one that failed half-way): they are not run again (waking a
   * part that is awake remaps memory vLLM already mapped). `onPhase` hears each phase as it
   * finishes. A failing phase throws WakeError naming it and the phases this call finished.
   */
  async wakeUp(level: 1 | 2, tags: readonly SleepTag[] = [], o: WakeOptions = {}): Promise<WakeOutcome> {
    const done = new Set<string>(o.done ?? [])
    const phases: VllmWakePhase[] = []
    const call = { signal: o.signal, ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}) }
    const step = async (phase: VllmWakePhase, run: () => Promise<unknown>) => {
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

  async isSleeping(o: CallOptions = {}): Promise<boolean> {
    const body = (await (await this.call('GET', '/is_sleeping', o, 5000)).json()) as { is_sleeping?: unknown }
    return body.is_sleeping === true
  }

  /**
   * sleepGauge: which sleep gauge the engine exports, as its /metrics showed: `component` (current
   * builds, `vllm:engine_sleep_component_state`), `state` (0.11.1 until then, `vllm:engine_sleep_state`),
   * `none` (older); null until /metrics was read.
   */
  sleepGauge: SleepGauge | null = null

  /**
   * sleepLevel: the level the engine says it sleeps at (0 awake) from its sleep gauge (see
   * readSleepLevel); null when it exports none.
   */
  async sleepLevel(o: CallOptions = {}): Promise<0 | 1 | 2 | null> {
    const read = readSleepLevel(await this.metricsText(o))
    this.sleepGauge = read.gauge
    return read.level
  }

  /**
   * drainedSleepMode: `keep` on a build that exports the component gauge (its sleep keeps the
   * requests on the engine and recomputes them after the wake), else `wait`. An older build's
   * `keep` leaves the requests pointing at KV blocks the sleep discards, so it is not used there.
   * Reads /metrics once; an engine whose /metrics fails gets `wait`.
   */
  async drainedSleepMode(o: CallOptions = {}): Promise<SleepMode> {
    if (this.sleepGauge === null) await this.sleepLevel(o).catch(() => null)
    return this.sleepGauge === 'component' ? 'keep' : 'wait'
  }

  /**
   * canReleaseKvCache: whether the engine has `POST /release_kv_cache_memory` (current builds, dev
   * mode): asked with a GET, which the route answers 405 (a POST route) and an engine without it
   * 404. Learnt once. Nothing in modelgate frees the KV cache alone yet.
   */
  kvCacheRelease: boolean | null = null

  async canReleaseKvCache(o: CallOptions = {}): Promise<boolean> {
    if (this.kvCacheRelease !== null) return this.kvCacheRelease
    const res = await this.answer('GET', '/release_kv_cache_memory', o, 5000)
    await res.body?.cancel()
    if (res.status !== 404 && res.status !== 405)
      throw new EngineCallError(`engine GET /release_kv_cache_memory answered ${res.status}`, res.status)
    this.kvCacheRelease = res.status === 405
    return this.kvCacheRelease
  }

  /**
   * releaseKvCache: `POST /release_kv_cache_memory`: the engine pauses its scheduler and frees the
   * KV cache only (its weights stay); `/wake_up?tags=kv_cache` brings it back.
   */
  async releaseKvCache(o: CallOptions = {}): Promise<void> {
    await (await this.call('POST', '/release_kv_cache_memory', o, 120000)).body?.cancel()
  }

  /**
   * sleepOperationSeconds: the engine's own timing of its sleep-mode operations, the mean of
   * `vllm:rl_sleep_mode_operation_duration_seconds{operation}` (current builds); null when it
   * exports none.
   */
  async sleepOperationSeconds(o: CallOptions = {}): Promise<SleepOperationSeconds | null> {
    return readSleepOperationSeconds(await this.metricsText(o))
  }

  /** kvCacheUsage: `vllm:kv_cache_usage_perc` (0–1; older builds `vllm:gpu_cache_usage_perc`). */
  async kvCacheUsage(o: CallOptions = {}): Promise<number | null> {
    return readGauge(await this.metricsText(o), KV_USAGE)
  }

  /** usage: `vllm:generation_tokens_total`, `vllm:prompt_tokens_total` and the KV-cache use. */
  async usage(o: CallOptions = {}): Promise<EngineUsage> {
    const [generationTokens, promptTokens, kvCacheUsage] = await this.metrics(
      [['vllm:generation_tokens_total'], ['vllm:prompt_tokens_total'], KV_USAGE],
      o,
    )
    return {
      generationTokens: generationTokens ?? null,
      promptTokens: promptTokens ?? null,
      kvCacheUsage: kvCacheUsage ?? null,
    }
  }
}

export type SleepGauge = 'component' | 'state' | 'none'

/** SleepOperationSeconds: mean seconds of each sleep-mode operation the engine timed (null: none yet). */
export interface SleepOperationSeconds {
  sleep: number | null
  wake: number | null
  release_kv_cache_memory: number | null
}

const STATE_LEVELS: Record<string, 0 | 1 | 2> = { awake: 0, weights_offloaded: 1, discard_all: 2 }
const WEIGHTS_LEVELS: Record<string, 0 | 1 | 2> = { resident: 0, offloaded: 1, discarded: 2 }

/** sample: a sample line's labels and value, or undefined for a line of another metric. */
function sample(line: string, name: string): { labels: string; value: number } | undefined {
  if (!line.startsWith(`${name}{`)) return undefined
  const close = line.lastIndexOf('}')
  return {
    labels: line.slice(name.length + 1, close),
    value: Number(
      line
        .slice(close + 1)
        .trim()
        .split(' ')[0],
    ),
  }
}

const label = (labels: string, key: string) => new RegExp(`(?:^|,)${key}="([^"]*)"`).exec(labels)?.[1]

/**
 * readSleepLevel reads the level slept at from /metrics text. Current builds' component gauge
 * (`vllm:engine_sleep_component_state{component, state}`, 1 on the state each component is in):
 * the weights `resident` is awake (0) — a `paused` scheduler or `discarded` KV cache beside it is
 * a KV-only release, not a sleep —, `offloaded` level 1, `discarded` level 2. Older builds'
 * `vllm:engine_sleep_state{sleep_state}`: `awake` 0, `weights_offloaded` 1, `discard_all` 2. The
 * component gauge wins where both are exported.
 */
export function readSleepLevel(text: string): { level: 0 | 1 | 2 | null; gauge: SleepGauge } {
  let state: 0 | 1 | 2 | null = null
  let seenState = false
  let component: 0 | 1 | 2 | null = null
  let seenComponent = false
  for (const line of text.split('\n')) {
    const c = sample(line, 'vllm:engine_sleep_component_state')
    if (c) {
      seenComponent = true
      const level = WEIGHTS_LEVELS[label(c.labels, 'state') ?? '']
      if (label(c.labels, 'component') === 'weights' && level !== undefined && c.value >= 1) component = level
      continue
    }
    const s = sample(line, 'vllm:engine_sleep_state')
    if (s) {
      seenState = true
      const level = STATE_LEVELS[label(s.labels, 'sleep_state') ?? '']
      if (level !== undefined && s.value >= 1 && state === null) state = level
    }
  }
  if (seenComponent) return { level: component, gauge: 'component' }
  return { level: state, gauge: seenState ? 'state' : 'none' }
}

/**
 * readSleepOperationSeconds: per operation, `_sum / _count` of
 * `vllm:rl_sleep_mode_operation_duration_seconds` (summed over the other labels); null when the
 * histogram is absent.
 */
export function readSleepOperationSeconds(text: string): SleepOperationSeconds | null {
  const name = 'vllm:rl_sleep_mode_operation_duration_seconds'
  const sums = new Map<string, number>()
  const counts = new Map<string, number>()
  let seen = false
  for (const line of text.split('\n')) {
    for (const [suffix, into] of [
      ['_sum', sums],
      ['_count', counts],
    ] as const) {
      const s = sample(line, `${name}${suffix}`)
      const op = s && label(s.labels, 'operation')
      if (!s || op === undefined || !Number.isFinite(s.value)) continue
      seen = true
      into.set(op, (into.get(op) ?? 0) + s.value)
    }
  }
  if (!seen) return null
  const mean = (op: string) => {
    const n = counts.get(op) ?? 0
    return n > 0 ? (sums.get(op) ?? 0) / n : null
  }
  return {
    sleep: mean('sleep'),
    wake: mean('wake'),
    release_kv_cache_memory: mean('release_kv_cache_memory'),
  }
}
