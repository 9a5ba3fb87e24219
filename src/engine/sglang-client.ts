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
 *   the engine dies. So this client reads the running and queued requests from /metrics before a
 *   release (a best effort: the gauges follow the scheduler's logging), releases and resumes every
 *   tag at once, and never resumes an engine it knows is awake.
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
export const SGLANG_WAKE_PHASES = ['resume'] as const

export class SglangClient extends EngineHttp implements EngineClient {
  /** sleepMode: true once a release was answered 2xx (SGLang has no 404 to teach false). */
  sleepMode: boolean | null = null

  /** released: whether this client last released (true) or resumed (false) the engine; null: not known. */
  released: boolean | null = null

  /** probePath: a sleeping engine is asked /get_model_info, never the generating /health. */
  protected override probePath(o: ProbeOptions): string {
    return (o.asleep ?? this.released === true) ? '/get_model_info' : '/health'
  }

  /**
   * sleep: `POST /release_memory_occupation {}` at level 1 (the weights kept in CPU memory, the KV
   * cache and CUDA graphs freed: the driver launches with `--enable-weights-cpu-backup`). Refused,
   * before anything is asked of the engine, when it runs or queues requests. SGLang has no sleep
   * mode parameter: the result is null.
   */
  async sleep(level: 1 | 2, o: CallOptions & { mode?: SleepMode } = {}): Promise<SleepMode | null> {
    if (level !== 1) throw new EngineCallError(`SGLang sleeps at level 1 only (asked for ${level})`, null)
    const busy = await this.busy(o)
    if (busy)
      throw new EngineCallError(
        `the engine still has ${busy} request(s) running or queued; SGLang's release asserts an idle ` +
          'scheduler (a release under load kills the engine), so it was not asked to sleep',
        null,
      )
    await (await this.call('POST', '/release_memory_occupation', o, 120000, '{}')).body?.cancel()
    this.sleepMode = true
    this.released = true
    return null
  }

  /** busy: requests running or queued per the engine's /metrics; 0 when it exports none. */
  private async busy(o: CallOptions): Promise<number> {
    let text: string
    try {
      text = await this.metricsText({ signal: o.signal, timeoutMs: Math.min(o.timeoutMs ?? 3000, 3000) })
    } catch {
      return 0
    }
    return (
      (readGauge(text, ['sglang:num_running_reqs']) ?? 0) + (readGauge(text, ['sglang:num_queue_reqs']) ?? 0)
    )
  }

  /**
   * wakeUp: one phase, `resume` (`POST /resume_memory_occupation {}`: every tag the release took).
   * SGLang wakes whole, so `tags` are refused; an engine this client knows to be awake is not
   * resumed again (a second resume kills it), nor one whose `resume` an earlier wake finished.
   */
  async wakeUp(_level: 1 | 2, tags: readonly SleepTag[] = [], o: WakeOptions = {}): Promise<WakeOutcome> {
    if (tags.length) throw new EngineCallError('SGLang wakes whole: a wake cannot name tags', null)
    if (this.released === false || o.done?.includes('resume')) return { phases: [], sleeping: false }
    const call = { signal: o.signal, ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}) }
    try {
      await (await this.call('POST', '/resume_memory_occupation', call, 300000, '{}')).body?.cancel()
    } catch (err) {
      const status = err instanceof EngineCallError ? err.status : null
      throw new WakeError(`wake failed at resume: ${(err as Error).message}`, status, 'resume', [])
    }
    this.released = false
    o.onPhase?.('resume')
    return { phases: ['resume'], sleeping: false }
  }

  async isSleeping(_o: CallOptions = {}): Promise<boolean> {
    if (this.released === null)
      throw new EngineCallError('SGLang has no endpoint that tells whether it sleeps', null)
    return this.released
  }

  /** sleepLevel: what this client did (SGLang does not say): 1 released, 0 resumed, null not known. */
  async sleepLevel(_o: CallOptions = {}): Promise<0 | 1 | 2 | null> {
    return this.released === null ? null : this.released ? 1 : 0
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
