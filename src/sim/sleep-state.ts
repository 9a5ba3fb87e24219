/**
 * SleepState tracks vLLM's sleep mode: level 1 offloads weights and drops the KV cache, level 2 drops
 * both; `wake_up` can restore `weights` and `kv_cache` separately, and the engine counts as sleeping
 * until both are back. Requests wait for `whenAwake` callbacks instead of running on a sleeping engine.
 */
export type SleepTag = 'weights' | 'kv_cache'

export class SleepState {
  level: 0 | 1 | 2 = 0
  private asleep = new Set<SleepTag>()
  private waiters: (() => void)[] = []

  get sleeping(): boolean {
    return this.asleep.size > 0
  }

  isAsleep(tag: SleepTag): boolean {
    return this.asleep.has(tag)
  }

  sleep(level: 1 | 2): void {
    this.level = level
    this.asleep = new Set(['weights', 'kv_cache'])
  }

  wake(tags: SleepTag[]): void {
    for (const tag of tags) this.asleep.delete(tag)
    if (this.sleeping) return
    this.level = 0
    const waiters = this.waiters
    this.waiters = []
    for (const w of waiters) w()
  }

  /** whenAwake runs cb now if awake, else after the last part wakes up. */
  whenAwake(cb: () => void): void {
    if (this.sleeping) this.waiters.push(cb)
    else cb()
  }

  /**
   * footprintMib is what the device shows for this engine: while asleep a residual (10% of the awake
   * footprint at level 1, 5% at level 2) plus whichever parts are awake again.
   */
  footprintMib(awakeMib: number, weightsMib: number): number {
    if (!this.sleeping) return awakeMib
    const residual = Math.round(awakeMib * (this.level === 2 ? 0.05 : 0.1))
    const weights = Math.min(weightsMib, awakeMib - residual)
    let mib = residual
    if (!this.asleep.has('weights')) mib += weights
    if (!this.asleep.has('kv_cache')) mib += Math.max(0, awakeMib - residual - weights)
    return mib
  }
}
