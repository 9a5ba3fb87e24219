import { GIB, type ModelSpec, weightsGiB } from './models.ts'

/**
 * MemoryPlan is the per-GPU arithmetic a vLLM worker does at start-up: budget = utilization × device,
 * minus weights, CUDA graphs, activation peak and non-torch memory, leaves the KV cache. Every number
 * the simulator logs or records comes from here, so the log lines and the smi figures always agree.
 */
export interface MemoryPlan {
  deviceTotalGiB: number
  utilization: number
  budgetGiB: number
  budgetMib: number
  /** Per TP rank. */
  weightsGiB: number
  weightsMib: number
  graphsGiB: number
  activationGiB: number
  nonTorchGiB: number
  kvAvailGiB: number
  kvBytesPerTokenPerRank: number
  numBlocks: number
  kvTokens: number
  maxModelLen: number
  concurrency: number
}

export const BLOCK_SIZE = 16
export const DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

/**
 * planMemory: with `kvcached` (a shared-cache engine) the KV cache is kvcached's process-local
 * capacity instead of vLLM's profile: budget − weights − activation peak, the whole-device non-torch
 * and CUDA-graph figures ignored (kvcached's patched `determine_available_memory`).
 */
export function planMemory(
  model: ModelSpec,
  deviceTotalMib: number,
  utilization: number,
  tp: number,
  maxModelLen: number,
  opts: { kvcached?: boolean } = {},
): MemoryPlan {
  const deviceTotalGiB = deviceTotalMib / 1024
  const budgetMib = Math.floor(utilization * deviceTotalMib)
  const budgetGiB = budgetMib / 1024
  const perRankParams = model.paramsB / tp
  const weights = weightsGiB(model) / tp
  const graphsGiB = Math.min(1, 0.5 + 0.02 * perRankParams)
  const activationGiB = Math.min(1.2, 0.25 + 0.06 * perRankParams)
  const nonTorchGiB = 0.1 + (tp > 1 ? 0.45 : 0)
  const kvAvailGiB = opts.kvcached
    ? budgetGiB - weights - activationGiB
    : budgetGiB - weights - graphsGiB - activationGiB - nonTorchGiB
  const headsPerRank = Math.max(1, model.kvHeads / tp)
  const kvBytesPerTokenPerRank = 2 * model.layers * headsPerRank * model.headDim * model.dtypeBytes
  const numBlocks = Math.max(0, Math.floor((kvAvailGiB * GIB) / (BLOCK_SIZE * kvBytesPerTokenPerRank)))
  const kvTokens = numBlocks * BLOCK_SIZE
  return {
    deviceTotalGiB,
    utilization,
    budgetGiB,
    budgetMib,
    weightsGiB: weights,
    weightsMib: Math.round(weights * 1024),
    graphsGiB,
    activationGiB,
    nonTorchGiB,
    kvAvailGiB,
    kvBytesPerTokenPerRank,
    numBlocks,
    kvTokens,
    maxModelLen,
    concurrency: kvTokens / maxModelLen,
  }
}

/** nonKvMib is what an engine holds besides its KV cache (kvcached engines grow from here). */
export function nonKvMib(plan: MemoryPlan): number {
  return Math.round((plan.weightsGiB + plan.graphsGiB + plan.activationGiB + plan.nonTorchGiB) * 1024)
}

/** kvCacheError is vLLM's start-up failure when the KV cache cannot hold one full-length request. */
export function kvCacheError(plan: MemoryPlan): string | undefined {
  if (plan.numBlocks <= 0) {
    return 'ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.'
  }
  if (plan.kvTokens >= plan.maxModelLen) return undefined
  const needGiB = (plan.maxModelLen * plan.kvBytesPerTokenPerRank) / GIB
  return (
    `ValueError: To serve at least one request with the models's max seq len (${plan.maxModelLen}), ` +
    `(${pyRound(needGiB)} GiB KV cache is needed, which is larger than the available KV cache memory ` +
    `(${pyRound(plan.kvAvailGiB)} GiB). Based on the available memory, the estimated maximum model length is ` +
    `${plan.kvTokens}. Try increasing \`gpu_memory_utilization\` or decreasing \`max_model_len\` when initializing the engine.`
  )
}

/** pyRound prints `round(x, 2)` the way Python does (`79.1`, not `79.10`). */
export function pyRound(x: number, digits = 2): string {
  const s = String(Number(x.toFixed(digits)))
  return s.includes('.') || s.includes('e') ? s : `${s}.0`
}
