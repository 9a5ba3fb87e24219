import {
  type CallOptions,
  EngineCallError,
  type EngineClient,
  EngineHttp,
  type EngineUsage,
  type ProbeOptions,
  readGauge,
  type SleepMode,
  type SleepTag,
  WakeError,
  type WakeOptions,
  type WakeOutcome,
} from './engine-client.ts'

/**
 * SglangClient is SGLang's control client (the SGLang driver's), on EngineHttp's transport. What it
 * relies on, read in sgl-project/sglang:
 *
 * - `GET /health` (= `/health_generate`, entrypoints/http_server.py): 503 while the server is
 *   starting (until its warmup request passed) or shutting down; otherwise it sends a one-token
 *   generation through the scheduler and answers 200 once anything comes back (up to
 *   SGLANG_HEALTH_CHECK_TIMEOUT, 20 s; it checks once a second, so a healthy answer takes about a
 *   second). Newer builds skip the generation when SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off.
 * - `POST /release_memory_occupation {"tags"?}` and `POST /resume_memory_occupation {"tags"?}` need a
 *   JSON body (FastAPI validates it; `{}` means every tag) and answer 200 (`null`), or 400
 *   `{"error": {"message"}}`. They release and restore what `--enable-memory-saver` put in
 *   torch_memory_saver regions: weights (kept in CPU memory with `--enable-weights-cpu-backup`,
 *   discarded without), KV cache (flushed), CUDA graphs. Without `--enable-memory-saver` the calls
 *   succeed and free nothing.
 * - The scheduler asserts it is idle when asked to release (`release_memory_occupation should be
 *   called only when no ongoing request`, managers/scheduler_update_weights_mixin.py), and a resume
 *   removes each tag from its set of released ones (`offload_tags.remove`, a KeyError for a tag not
 *   released). Either failure is an exception in the scheduler process, which SIGQUITs the server:
 *   the engine dies. The idle check covers every queue: running, waiting, the grammar queue, paused
 *   and retracted requests. So this client asks `GET /get_load` (one entry per data-parallel rank,
 *   answered by the scheduler itself, each `num_*_reqs` a count of one queue) before a release and
 *   refuses the sleep when any is non-zero; an engine without /get_load (older builds: 404) is read
 *   from its /metrics gauges of the same queues instead. It releases and resumes every tag at once,
 *   and never resumes an engine it knows is awake.
 * - A release can answer before the memory is given back (the driver frees the pages after the call
 *   returns): the gateway's sleep check waits for nvidia-smi to show it (plugins/gateway/sleep-wake.ts).
 * - Level 2 discards the weights: the wake resumes the memory (whose weights are then garbage
 *   without `--enable-weights-cpu-backup`), then reloads them, `POST /update_weights_from_disk
 *   {"model_path"}` (the path `/get_model_info` gave before the release). A reload on released
 *   memory touches unmapped pages (the engine dies), so `resume` always comes first.
 * - A generation on released memory touches unmapped pages (torch_memory_saver unmaps them): no
 *   request, and no /health generation, may reach a sleeping engine. A sleeping engine is probed
 *   with `GET /get_model_info`, answered by the server process without the scheduler; a dead
 *   scheduler takes the server down with it (the SIGQUIT above), which ends the process.
 * - There is no endpoint that says whether the engine sleeps: the client knows what it did, and
 *   says it cannot tell otherwise (after a restart of modelgate the instance's row tells).
 * - `/metrics` (with `--enable-metrics`, metrics/collector.py): `sglang:num_running_reqs`,
 *   `sglang:num_queue_reqs`, `sglang:token_usage` (KV pool in use, 0–1), `sglang:prompt_tokens_total`,
 *   `sglang:generation_tokens_total`, `sglang:time_to_first_token_seconds`,
 *   `sglang:e2e_request_latency_seconds`, labelled `model_name`.
 * - `POST /tokenize` (also `/v1/tokenize`, newer builds) answers `{tokens, count, max_model_len}`.
 */
export const SGLANG_WAKE_PHASES = ['resume', 'reload_weights'] as const

/** The queue gauges of /metrics, for an engine without /get_load (the same queues). */
const QUEUE_GAUGES = [
  'sglang:num_running_reqs',
  'sglang:num_queue_reqs',
  'sglang:num_grammar_queue_reqs',
  'sglang:num_paused_reqs',
  'sglang:num_retracted_reqs',
]

/**
 * loadCount: the requests `/get_load` reports, summed over its ranks: every `num_*_reqs` count but
 * `num_reqs` (the running and waiting ones again, on builds that have the split counts).
 */
export function loadCount(body: unknown): number {
  const ranks = Array.isArray(body) ? body : [body]
  let total = 0
  for (const r of ranks) {
    if (!r || typeof r !== 'object') continue
    const entries = Object.entries(r as Record<string, unknown>).filter(
      ([k, v]) => /^num_\w*reqs$/.test(k) && typeof v === 'number',
    )
    const split = entries.some(([k]) => k !== 'num_reqs' && k !== 'num_waiting_reqs')
    for (const [k, v] of entries) if (!(split && k === 'num_reqs')) total += v as number
  }
  return total
}

export class SglangClient extends EngineHttp implements EngineClient {
  /** sleepMode: true once a release was answered 2xx (SGLang has no 404 to teach false). */
  sleepMode: boolean | null = null

  /** released: whether this client last released (true) or resumed (false) the engine; null: not known. */
  released: boolean | null = null

  /** probePath: a sleeping engine is asked /get_model_info, never the generating /health. */
  protected override probePath(o: ProbeOptions): string {
    return (o.asleep ?? this.released === true) ? '/get_model_info' : '/health'
  }

  /** modelPath: the engine's weights, read before a level-2 release (the reload reads them again). */
  private modelPath: string | null = null

  /** level: the level of the last release (2: the weights must be reloaded by the wake). */
  private level: 1 | 2 = 1

  /**
   * sleep: `POST /release_memory_occupation {}`: the weights (kept in CPU memory with
   * `--enable-weights-cpu-backup`, which the driver launches with), the KV cache and the CUDA graphs
   * freed. Level 2 treats the weights as discarded: its wake reloads them from disk. Refused, before
   * anything is asked of the engine, when any of its queues holds a request. SGLang has no sleep mode
   * parameter: the result is null.
   */
  async sleep(level: 1 | 2, o: CallOptions & { mode?: SleepMode } = {}): Promise<SleepMode | null> {
    const busy = await this.busy(o)
    if (busy)
      throw new EngineCallError(
        `the engine still has ${busy} request(s) running, queued or paused; SGLang's release asserts an ` +
          'idle scheduler (a release under load kills the engine), so it was not asked to sleep',
        null,
      )
    if (level === 2) this.modelPath = await this.weightsPath(o)
    await (await this.call('POST', '/release_memory_occupation', o, 120000, '{}')).body?.cancel()
    this.sleepMode = true
    this.released = true
    this.level = level
    return null
  }

  /** weightsPath: the model path `/get_model_info` names (answered by the server, asleep or awake). */
  private async weightsPath(o: CallOptions): Promise<string> {
    const info = (await (await this.call('GET', '/get_model_info', o, 5000)).json()) as {
      model_path?: unknown
    }
    if (typeof info.model_path !== 'string')
      throw new EngineCallError('SGLang /get_model_info named no model_path to reload the weights from', null)
    return info.model_path
  }

  /** busy: the requests in any of the scheduler's queues (`/get_load`, else /metrics; 0 when neither says). */
  private async busy(o: CallOptions): Promise<number> {
    const call = { signal: o.signal, timeoutMs: Math.min(o.timeoutMs ?? 3000, 3000) }
    const res = await this.answer('GET', '/get_load', call, 3000)
    if (res.status === 200) return loadCount(await res.json())
    await res.body?.cancel()
    if (res.status !== 404)
      throw new EngineCallError(`engine GET /get_load answered ${res.status}`, res.status)
    let text: string
    try {
      text = await this.metricsText(call)
    } catch {
      return 0
    }
    return QUEUE_GAUGES.reduce((n, g) => n + (readGauge(text, [g]) ?? 0), 0)
  }

  /**
   * wakeUp: `resume` (`POST /resume_memory_occupation {}`: every tag the release took), then after a
   * level-2 sleep `reload_weights` (`POST /update_weights_from_disk {"model_path"}`). SGLang wakes
   * whole, so `tags` are refused; an engine this client knows to be awake is not resumed again (a
   * second resume kills it), nor one whose `resume` an earlier wake finished.
   */
  async wakeUp(level: 1 | 2, tags: readonly SleepTag[] = [], o: WakeOptions = {}): Promise<WakeOutcome> {
    if (tags.length) throw new EngineCallError('SGLang wakes whole: a wake cannot name tags', null)
    if (this.released === false && this.level !== 2) return { phases: [], sleeping: false }
    const call = { signal: o.signal, ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}) }
    const phases: string[] = []
    const done = [...(o.done ?? [])]
    const run = async (phase: string, path: string, body: string) => {
      try {
        await (await this.call('POST', path, call, 300000, body)).body?.cancel()
      } catch (err) {
        const status = err instanceof EngineCallError ? err.status : null
        throw new WakeError(`wake failed at ${phase}: ${(err as Error).message}`, status, phase, phases)
      }
      phases.push(phase)
      done.push(phase)
      o.onPhase?.(phase)
    }
    if (this.released !== false && !done.includes('resume'))
      await run('resume', '/resume_memory_occupation', '{}')
    this.released = false
    // A client that did not release the engine (a restarted modelgate) asks the server for the path.
    if ((level === 2 || this.level === 2) && !done.includes('reload_weights')) {
      let path = this.modelPath
      try {
        path ??= await this.weightsPath(call)
      } catch (err) {
        const status = err instanceof EngineCallError ? err.status : null
        throw new WakeError(
          `wake failed at reload_weights: ${(err as Error).message}`,
          status,
          'reload_weights',
          phases,
        )
      }
      await run('reload_weights', '/update_weights_from_disk', JSON.stringify({ model_path: path }))
      this.level = 1
    }
    return { phases, sleeping: false }
  }

  async isSleeping(_o: CallOptions = {}): Promise<boolean> {
    if (this.released === null)
      throw new EngineCallError('SGLang has no endpoint that tells whether it sleeps', null)
    return this.released
  }

  /** sleepLevel: what this client did (SGLang does not say): its level released, 0 resumed, null not known. */
  async sleepLevel(_o: CallOptions = {}): Promise<0 | 1 | 2 | null> {
    return this.released === null ? null : this.released ? this.level : 0
  }

  /** kvCacheUsage: `sglang:token_usage`, the share of the KV pool's tokens in use (0–1). */
  async kvCacheUsage(o: CallOptions = {}): Promise<number | null> {
    return readGauge(await this.metricsText(o), ['sglang:token_usage'])
  }

  /** usage: `sglang:generation_tokens_total`, `sglang:prompt_tokens_total`, `sglang:token_usage`. */
  async usage(o: CallOptions = {}): Promise<EngineUsage> {
    const [generationTokens, promptTokens, kvCacheUsage] = await this.metrics(
      [['sglang:generation_tokens_total'], ['sglang:prompt_tokens_total'], ['sglang:token_usage']],
      o,
    )
    return {
      generationTokens: generationTokens ?? null,
      promptTokens: promptTokens ?? null,
      kvCacheUsage: kvCacheUsage ?? null,
    }
  }
}
