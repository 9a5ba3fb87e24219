import { GIB, type ModelSpec, weightsGiB } from './models.ts'

/**
 * SglangPlan is the per-GPU arithmetic an SGLang scheduler does at start-up (model_runner memory
 * profiling, read in sgl-project/sglang): `--mem-fraction-static` is a share of the memory free
 * when the rank starts (after torch's own init), not of the whole device. The KV pool gets what
 * that share leaves after the weights: rest = free_after_weights − free_at_start × (1 −
 * fraction) = fraction × free_at_start − weights; no room (rest ≤ 0) is `RuntimeError: Not enough
 * memory. Please try to increase --mem-fraction-static.` CUDA graphs come out of the remaining
 * (1 − fraction). The pool counts tokens (page size 1): K and V of every layer per token.
 * Every figure the simulator logs or records comes from here.
 */
export interface SglangPlan {
  deviceTotalMib: number
  fraction: number
  /** CUDA context and communication buffers taken before `Load weight begin` */
  contextGiB: number
  freeAtStartGiB: number
  weightsGiB: number
  kvTokens: number
  kvGiB: number
  graphsGiB: number
  kvBytesPerTokenPerRank: number
  contextLen: number
  /** the memory the engine's processes hold per GPU, awake */
  footprintMib: number
}

/** defaultFraction: SGLang's default --mem-fraction-static by tensor parallelism (server_args). */
export function defaultFraction(tp: number): number {
  if (tp >= 16) return 0.79
  if (tp >= 8) return 0.81
  if (tp >= 4) return 0.85
  if (tp >= 2) return 0.87
  return 0.88
}

export function planSglangMemory(
  model: ModelSpec,
  deviceTotalMib: number,
  freeMib: number,
  fraction: number,
  tp: number,
  contextLen: number,
  cudaGraphs: boolean,
): SglangPlan {
  const contextGiB = 0.5 + (tp > 1 ? 0.45 : 0)
  const freeAtStartGiB = Math.max(0, freeMib / 1024 - contextGiB)
  const weights = weightsGiB(model) / tp
  const headsPerRank = Math.max(1, model.kvHeads / tp)
  const kvBytesPerTokenPerRank = 2 * model.layers * headsPerRank * model.headDim * model.dtypeBytes
  const rest = fraction * freeAtStartGiB - weights
  const kvTokens = rest > 0 ? Math.floor((rest * GIB) / kvBytesPerTokenPerRank) : 0
  const kvGiB = (kvTokens * kvBytesPerTokenPerRank) / GIB
  const graphsGiB = cudaGraphs ? Math.min(1, 0.3 + (0.02 * model.paramsB) / tp) : 0
  return {
    deviceTotalMib,
    fraction,
    contextGiB,
    freeAtStartGiB,
    weightsGiB: weights,
    kvTokens,
    kvGiB,
    graphsGiB,
    kvBytesPerTokenPerRank,
    contextLen,
    footprintMib: Math.round((contextGiB + weights + kvGiB + graphsGiB) * 1024),
  }
}

/** sizes: the figures of `KV Cache is allocated. …`, K and V halves of the pool (`%.2f` GB). */
export function kvSizes(plan: SglangPlan): { k: string; v: string } {
  const half = (plan.kvGiB / 2).toFixed(2)
  return { k: half, v: half }
}

export const NOT_ENOUGH_MEMORY = 'Not enough memory. Please try to increase --mem-fraction-static.'

/** The scheduler's context-length refusal when asked for more than the model has (model_config). */
export function contextLengthError(requested: number, model: ModelSpec): string {
  return (
    `ValueError: User-specified context_length (${requested}) is greater than the derived context_length ` +
    `(${model.maxModelLen}). This may lead to incorrect model outputs or CUDA errors. To allow overriding ` +
    'this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1'
  )
}
