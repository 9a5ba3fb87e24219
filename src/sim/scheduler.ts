/**
 * Scheduler imitates vLLM's admission: at most `max_num_seqs` running requests whose tokens fit in
 * the KV cache, the rest wait in FIFO order; nothing is admitted while the engine sleeps or its
 * scheduler is paused (the engine's `canAdmit` decides). Its token count drives
 * `vllm:kv_cache_usage_perc` and the kvcached segment's used_size.
 */
export interface Sequence {
  readonly id: string
  readonly promptTokens: number
  generated: number
  admit: () => void
  /** owner is the live request behind the sequence (the engine's pause rules look it up). */
  owner?: object
}

export class Scheduler {
  readonly running = new Set<Sequence>()
  private waiting: Sequence[] = []
  private tokens = 0

  constructor(
    private readonly maxNumSeqs: number,
    readonly kvTokens: number,
    private readonly canAdmit: (seq: Sequence) => boolean,
    private readonly onChange: () => void = () => {},
  ) {}

  get numWaiting(): number {
    return this.waiting.length
  }

  /** usedTokens counts prompt and generated tokens of running requests. */
  get usedTokens(): number {
    return this.tokens
  }

  kvUsage(): number {
    return this.kvTokens > 0 ? Math.min(1, this.tokens / this.kvTokens) : 0
  }

  submit(seq: Sequence): void {
    this.waiting.push(seq)
    this.pump()
  }

  addToken(seq: Sequence): void {
    seq.generated++
    if (this.running.has(seq)) this.tokens++
  }

  /** drop removes a finished or aborted request and admits whoever now fits. */
  drop(seq: Sequence): void {
    if (this.running.delete(seq)) {
      this.tokens -= seq.promptTokens + seq.generated
      this.onChange()
    } else {
      const i = this.waiting.indexOf(seq)
      if (i >= 0) this.waiting.splice(i, 1)
    }
    this.pump()
  }

  /** pump admits waiting requests in order while there is room; call it after a wake-up. */
  pump(): void {
    let admitted = 0
    while (this.waiting.length > 0 && this.running.size < this.maxNumSeqs) {
      const next = this.waiting[0]
      if (!next || !this.canAdmit(next)) break
      const fits = this.tokens + next.promptTokens + 1 <= this.kvTokens
      if (!fits && this.running.size > 0) break
      this.waiting.shift()
      this.running.add(next)
      this.tokens += next.promptTokens + next.generated
      admitted++
      next.admit()
    }
    if (admitted > 0) this.onChange()
  }

  /** clear forgets every request (engine shutdown). */
  clear(): void {
    this.running.clear()
    this.waiting = []
    this.tokens = 0
  }
}
