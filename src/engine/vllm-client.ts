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
   * sleepLevel: what newer builds' `vllm:engine_sleep_state{sleep_state=…}` gauge says: 0 awake,
   * 1 `weights_offloaded`, 2 `discard_all`; null when the engine does not export it.
   */
  async sleepLevel(o: CallOptions = {}): Promise<0 | 1 | 2 | null> {
    const text = await this.metricsText(o)
    const levels: Record<string, 0 | 1 | 2> = { awake: 0, weights_offloaded: 1, discard_all: 2 }
    for (const line of text.split('\n')) {
      if (!line.startsWith('vllm:engine_sleep_state{')) continue
      const state = /sleep_state="([^"]*)"/.exec(line)?.[1]
      const level = state === undefined ? undefined : levels[state]
      if (level !== undefined && Number(line.slice(line.lastIndexOf(' ') + 1)) >= 1) return level
    }
    return null
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
