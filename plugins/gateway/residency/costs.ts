import { publishedSeconds } from '../../../src/engine/vllm-timing.ts'

/**
 * What it costs to bring a model back after each way of freeing its memory, in seconds: this
 * host's own measurements of the model on its engine when it has any (the last wake from each sleep
 * level, the last cold load; an SGLang engine's are SGLang's own, never a vLLM instance's of the same
 * name), else the engine's default figures for the weights' size (ENGINE_DEFAULTS). A model whose
 * weights were never measured counts as 16 GiB (DEFAULT_WEIGHTS_GIB).
 */
export type EvictAction = 'sleep1' | 'sleep2' | 'unload'

export const DEFAULT_WEIGHTS_GIB = 16

export interface Measured {
  /** Last wake from level 1 / level 2, and last cold load (start to active), in seconds; null when never seen. */
  wake1: number | null
  wake2: number | null
  load: number | null
}

export interface BringBack {
  wake_l1_s: number
  wake_l2_s: number
  load_s: number
  /** Which of the three come from this host's measurements. */
  measured: { wake_l1: boolean; wake_l2: boolean; load: boolean }
}

/**
 * ENGINE_DEFAULTS: each engine's figures before its own were measured. vLLM: its published ones
 * (src/engine/vllm-timing.ts). SGLang publishes none; its wakes do the work vLLM's do (level 1: the
 * weights copied back from CPU memory; level 2: resumed, then read from disk by
 * /update_weights_from_disk) and its start-up loads the weights and captures CUDA graphs as vLLM's
 * does, so vLLM's figures stand in until SGLang's own replace them. An engine not listed takes vLLM's.
 */
export const ENGINE_DEFAULTS: Readonly<
  Record<string, (kind: 'wake1' | 'wake2' | 'load', weightsGib: number) => number>
> = {
  vllm: publishedSeconds,
  sglang: publishedSeconds,
}

export function defaultSeconds(action: EvictAction, weightsGib: number | null, engineKind = 'vllm'): number {
  const w = weightsGib ?? DEFAULT_WEIGHTS_GIB
  const figures = ENGINE_DEFAULTS[engineKind] ?? publishedSeconds
  return figures(action === 'sleep1' ? 'wake1' : action === 'sleep2' ? 'wake2' : 'load', w)
}

export function bringBack(measured: Measured, weightsGib: number | null, engineKind = 'vllm'): BringBack {
  return {
    wake_l1_s: measured.wake1 ?? defaultSeconds('sleep1', weightsGib, engineKind),
    wake_l2_s: measured.wake2 ?? defaultSeconds('sleep2', weightsGib, engineKind),
    load_s: measured.load ?? defaultSeconds('unload', weightsGib, engineKind),
    measured: {
      wake_l1: measured.wake1 !== null,
      wake_l2: measured.wake2 !== null,
      load: measured.load !== null,
    },
  }
}

/**
 * withEngineWake: a level-1 wake this host never measured takes the engine's own timing of its
 * wake-ups (vLLM's `vllm:rl_sleep_mode_operation_duration_seconds{operation="wake"}` mean,
 * VllmClient.sleepOperationSeconds; null: the engine has none). A level-2 wake is left alone: it
 * also reloads the weights, which that figure does not time.
 */
export function withEngineWake(m: Measured, engineWakeS: number | null): Measured {
  return m.wake1 === null && engineWakeS !== null ? { ...m, wake1: engineWakeS } : m
}

export function secondsAfter(action: EvictAction, b: BringBack): number {
  return action === 'sleep1' ? b.wake_l1_s : action === 'sleep2' ? b.wake_l2_s : b.load_s
}

/**
 * chanceOfUse: the probability that a model is asked for within `horizonSeconds`, taking its
 * requests as a Poisson process at its recent rate (requests per second).
 */
export function chanceOfUse(ratePerSecond: number, horizonSeconds: number): number {
  return 1 - Math.exp(-Math.max(0, ratePerSecond) * horizonSeconds)
}

/**
 * RequestRate keeps a model's recent arrivals (a ring of the last 64) and reads its rate over the
 * last `windowMs`: a count, so a burst shows at once and fades when it ends.
 */
export class RequestRate {
  private readonly times = new Float64Array(64)
  private next = 0
  private count = 0
  last: number | null = null

  arrived(at: number): void {
    this.times[this.next] = at
    this.next = (this.next + 1) % this.times.length
    if (this.count < this.times.length) this.count++
    this.last = at
  }

  /** perSecond: arrivals in the last windowMs (at most 64 counted), per second. */
  perSecond(now: number, windowMs: number): number {
    let n = 0
    for (let k = 0; k < this.count; k++) if (now - this.times[k]! <= windowMs) n++
    return n / (windowMs / 1000)
  }
}
