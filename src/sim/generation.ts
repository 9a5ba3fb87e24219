import type { InferenceRuntime, LiveRequest } from './runtime.ts'
import type { Sequence } from './scheduler.ts'
import { OutputWords } from './tokenizer.ts'

/**
 * Generation paces one request's output: it waits for admission, for the prefill / SIM_TTFT_MS delay
 * and for the engine to be able to run it (awake, scheduler not paused), then emits one word-token
 * per tick at SIM_TOKENS_PER_SEC with its own timer (drift-corrected, no busy loop). It stops at
 * max_tokens ("length") or at the request's pseudo-EOS ("stop", an empty EOS token). A client can
 * abort it at any time; the engine can abort it too (a sleep with mode=abort: finish_reason "abort").
 * Without valid weights (after a level-2 sleep, before reload_weights) it emits GARBAGE_TOKEN, never
 * reaching an EOS, as a real engine running on discarded weights produces junk.
 */
export type FinishReason = 'stop' | 'length' | 'abort'

/** GARBAGE_TOKEN is what an engine without weights emits, token after token (no spaces). */
export const GARBAGE_TOKEN = '!'

export interface GenerationRequest {
  id: string
  promptTokens: number
  maxTokens: number
  /** Number of tokens before the pseudo-EOS (only used when ignoreEos is false). */
  eosAfter: number
  ignoreEos: boolean
  seed: number
}

export interface GenerationSink {
  /** token delivers one token's text; `finish` is set on the last one. */
  token(text: string, index: number, finish: FinishReason | null): void
  /** done is called once after the last token (not after an abort). */
  done(completionTokens: number): void
  /** fail ends the request with an engine error (SIM_CRASH_MODE=error, dead engine core). */
  fail(message: string): void
  /** aborted ends the request with finish_reason "abort" after `completionTokens` (engine-side abort). */
  aborted(completionTokens: number): void
}

const PREFILL_TOKENS_PER_MS = 20

export class Generation implements LiveRequest {
  private readonly seq: Sequence
  private readonly words: OutputWords
  private readonly interval: number
  private readonly stopAt: number
  private readonly reason: FinishReason
  private readonly arrivedAt = performance.now()
  private timer: ReturnType<typeof setTimeout> | undefined
  private due = 0
  private finished = false
  private unregister: () => void = () => {}

  constructor(
    private readonly rt: InferenceRuntime,
    private readonly req: GenerationRequest,
    private readonly sink: GenerationSink,
  ) {
    this.seq = {
      id: req.id,
      promptTokens: req.promptTokens,
      generated: 0,
      admit: () => this.admitted(),
      owner: this,
    }
    this.words = new OutputWords(req.seed)
    this.interval = 1000 / rt.knobs.tokensPerSec
    const eos = Math.max(1, req.eosAfter)
    this.stopAt = req.ignoreEos || eos >= req.maxTokens ? req.maxTokens : eos
    this.reason = this.stopAt === req.maxTokens ? 'length' : 'stop'
  }

  get done(): boolean {
    return this.finished
  }

  start(): void {
    this.unregister = this.rt.register(this)
    this.rt.scheduler.submit(this.seq)
  }

  fail(message: string): void {
    if (this.finished) return
    this.cancel()
    this.sink.fail(message)
  }

  /** abort is the engine finishing the request early (a sleep with mode=abort): finish_reason "abort". */
  abort(): void {
    if (this.finished) return
    this.cancel()
    this.rt.metrics.finish('abort', (performance.now() - this.arrivedAt) / 1000)
    this.sink.aborted(this.seq.generated)
  }

  /** disconnect stops a live request the way a client disconnect does, and logs it like vLLM. */
  disconnect(): void {
    if (this.finished) return
    this.cancel()
    this.rt.metrics.finish('abort', 0)
    this.rt.log.info(this.rt.tags.api, 'async_llm.py:436', `Aborted request ${this.req.id}.`)
  }

  cancel(): void {
    if (this.finished) return
    this.finished = true
    clearTimeout(this.timer)
    this.rt.scheduler.drop(this.seq)
    this.unregister()
  }

  private admitted(): void {
    if (this.finished) return
    const prefill = this.req.promptTokens / PREFILL_TOKENS_PER_MS
    this.due = performance.now() + Math.max(this.rt.knobs.ttftMs, prefill)
    this.schedule()
  }

  private schedule(): void {
    this.timer = setTimeout(() => this.tick(), Math.max(0, this.due - performance.now()))
  }

  private tick(): void {
    if (this.finished || this.rt.dying) return
    // Timers may fire a little early; a token never leaves before its time (TTFT ≥ SIM_TTFT_MS).
    if (performance.now() < this.due) {
      this.schedule()
      return
    }
    if (!this.rt.canRun(this.seq)) {
      // Older engines run on into the released memory and die; the default waits for the wake-up.
      if (this.rt.sleep.blocksInference && this.rt.knobs.sleepInference === 'crash') {
        this.rt.crash('RuntimeError: CUDA error: an illegal memory access was encountered (engine is asleep)')
        return
      }
      this.rt.whenRunnable(() => {
        this.due = performance.now()
        if (!this.finished) this.tick()
      })
      return
    }
    const index = this.seq.generated
    if (index === 0)
      this.rt.metrics.firstToken((performance.now() - this.arrivedAt) / 1000, this.req.promptTokens)
    this.rt.scheduler.addToken(this.seq)
    this.rt.metrics.generationTokens++
    const garbage = !this.rt.sleep.weightsValid
    const stopAt = garbage ? this.req.maxTokens : this.stopAt
    const reason: FinishReason = garbage ? 'length' : this.reason
    const last = this.seq.generated >= stopAt
    const isEos = last && reason === 'stop'
    let text: string
    if (garbage) text = GARBAGE_TOKEN
    else {
      const word = isEos ? '' : this.words.next()
      text = isEos || index === 0 ? word : ` ${word}`
    }
    this.sink.token(text, index, last ? reason : null)
    this.rt.countToken()
    if (last) {
      this.cancel()
      this.rt.metrics.finish(reason, (performance.now() - this.arrivedAt) / 1000)
      this.sink.done(this.seq.generated)
      return
    }
    this.due += this.interval
    this.schedule()
  }
}
