/**
 * SleepState tracks vLLM's sleep mode. The executor part: level 1 offloads the weights to CPU memory
 * and drops the KV cache, level 2 drops both (the weights are gone: `weightsValid` stays false until
 * `collective_rpc reload_weights`); `wake_up` restores `weights` and `kv_cache` separately and the
 * engine counts as sleeping until both are back. The scheduler part (newer engines, `/sleep?mode=`):
 * `paused` is `new` while only the requests already in the engine may run (`wait`, and after `abort`),
 * `all` when everything is frozen (`keep`); `wake_up` resumes it.
 */
export type SleepTag = 'weights' | 'kv_cache'

/** PauseMode is `/sleep?mode=`: abort running requests, wait for them, or keep them frozen. */
export type PauseMode = 'abort' | 'wait' | 'keep'

/**
 * SleepFrees is what a sleep really releases: everything (normal), the KV cache only (vllm#32714:
 * the weights stay on the GPU), the weights only (a kvcached engine: kvcached maps its KV pages
 * outside vLLM's sleep allocator, so they stay, and so does everything else) or nothing (an engine
 * started without `--enable-sleep-mode`, whose allocations are not in the sleep allocator's pool).
 */
export type SleepFrees = 'all' | 'kv_cache' | 'weights' | 'nothing'

export class SleepState {
  level: 0 | 1 | 2 = 0
  paused: 'no' | 'new' | 'all' = 'no'
  /** False once a level-2 sleep discarded the weights; reload_weights sets it again. */
  weightsValid = true
  private asleep = new Set<SleepTag>()
  private frees: SleepFrees = 'all'
  private waiters: (() => void)[] = []

  /** sleeping is what `/is_sleeping` answers: some part asleep, or the scheduler paused. */
  get sleeping(): boolean {
    return this.asleep.size > 0 || this.paused !== 'no'
  }

  /** executorAsleep: the memory side sleeps (some tag not woken yet). */
  get executorAsleep(): boolean {
    return this.asleep.size > 0
  }

  /** blocksInference: generating now would touch released memory (the sim then waits or crashes). */
  get blocksInference(): boolean {
    return this.asleep.size > 0 && this.frees !== 'nothing'
  }

  /** weightsReleased: the weights' GPU memory is gone (offloaded or discarded) and not woken yet. */
  get weightsReleased(): boolean {
    return this.asleep.has('weights') && this.releasesWeights
  }

  private get releasesWeights(): boolean {
    return this.frees === 'all' || this.frees === 'weights'
  }

  /** isAsleep: whether a part sleeps; any other name (vLLM takes any tag) is not asleep. */
  isAsleep(tag: string): boolean {
    return this.asleep.has(tag as SleepTag)
  }

  /** asleepTags: the parts still asleep, in the order they went to sleep (vLLM's sleeping_tags). */
  get asleepTags(): SleepTag[] {
    return [...this.asleep]
  }

  sleep(level: 1 | 2, frees: SleepFrees = 'all'): void {
    this.level = level
    this.frees = frees
    this.asleep = new Set(['weights', 'kv_cache'])
    if (level === 2 && this.releasesWeights) this.weightsValid = false
  }

  /**
   * releaseKvCache is current builds' `/release_kv_cache_memory`: the scheduler pauses and the KV
   * cache alone is freed (the weights stay); `wake_up` (all, or the kv_cache tag) brings it back.
   */
  releaseKvCache(): void {
    this.paused = 'all'
    this.level = 1
    this.frees = 'all'
    this.asleep = new Set(['kv_cache'])
  }

  /** components: what current builds' `vllm:engine_sleep_component_state` says. */
  get components(): {
    scheduler: 'running' | 'paused'
    weights: 'resident' | 'offloaded' | 'discarded'
    kv_cache: 'resident' | 'discarded'
  } {
    const weights = !this.asleep.has('weights') ? 'resident' : this.level === 2 ? 'discarded' : 'offloaded'
    return {
      scheduler: this.sleeping ? 'paused' : 'running',
      weights,
      kv_cache: this.asleep.has('kv_cache') ? 'discarded' : 'resident',
    }
  }

  wake(tags: SleepTag[]): void {
    for (const tag of tags) this.asleep.delete(tag)
    if (this.asleep.size === 0) this.level = 0
    this.flush()
  }

  /** resume unpauses the scheduler (newer engines do on every wake_up). */
  resume(): void {
    this.paused = 'no'
    this.flush()
  }

  /** whenAwake runs cb now if nothing sleeps, else once the last part wakes and the scheduler runs. */
  whenAwake(cb: () => void): void {
    if (this.sleeping) this.waiters.push(cb)
    else cb()
  }

  private flush(): void {
    if (this.sleeping) return
    const waiters = this.waiters
    this.waiters = []
    for (const w of waiters) w()
  }

  /**
   * footprintMib is what the device shows for this engine: while asleep a residual (10% of the awake
   * footprint at level 1, 5% at level 2) plus whatever was not released or is awake again; a sleep
   * that frees the weights only leaves everything but them.
   */
  footprintMib(awakeMib: number, weightsMib: number): number {
    if (this.asleep.size === 0 || this.frees === 'nothing') return awakeMib
    if (this.frees === 'weights')
      return this.asleep.has('weights') ? awakeMib - Math.min(weightsMib, awakeMib) : awakeMib
    const residual = Math.round(awakeMib * (this.level === 2 ? 0.05 : 0.1))
    const weights = Math.min(weightsMib, awakeMib - residual)
    let mib = residual
    if (this.frees === 'kv_cache' || !this.asleep.has('weights')) mib += weights
    if (!this.asleep.has('kv_cache')) mib += Math.max(0, awakeMib - residual - weights)
    return mib
  }
}
