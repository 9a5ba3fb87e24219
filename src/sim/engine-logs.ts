import { type MemoryPlan, pyRound } from './memory-plan.ts'
import type { ModelSpec } from './models.ts'
import type { VllmArgs } from './vllm-args.ts'

/**
 * engine-logs holds text builders for the longer vLLM start-up lines (engine config, V0 memory profile,
 * memory check and summary, route list), kept apart from the start-up sequence so its flow stays
 * readable. Their wording follows vLLM's format strings of the release each variant belongs to.
 */
export function engineConfigLine(
  style: 'v0' | 'v1',
  version: string,
  args: VllmArgs,
  maxModelLen: number,
): string {
  const served =
    args.servedModelNames.length === 1 ? args.servedModelNames[0] : `[${args.servedModelNames.join(', ')}]`
  return (
    `Initializing a ${style === 'v0' ? 'V0' : 'V1'} LLM engine (v${version}) with config: model='${args.model}', ` +
    `speculative_config=None, tokenizer='${args.model}', skip_tokenizer_init=False, tokenizer_mode=auto, ` +
    `revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=${maxModelLen}, ` +
    `download_dir=None, load_format=auto, tensor_parallel_size=${args.tensorParallelSize}, pipeline_parallel_size=1, ` +
    `data_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, ` +
    `kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=${served}, ` +
    'enable_prefix_caching=True, chunked_prefill_enabled=True, pooler_config=None'
  )
}

/** v0ProfileMessage is the V0 worker's multi-line memory profile message (one log record). */
export function v0ProfileMessage(plan: MemoryPlan, seconds: number): string {
  const g = (x: number) => `${x.toFixed(2)}GiB`
  return [
    `Memory profiling takes ${seconds.toFixed(2)} seconds`,
    `the current vLLM instance can use total_gpu_memory (${g(plan.deviceTotalGiB)}) x gpu_memory_utilization ` +
      `(${plan.utilization.toFixed(2)}) = ${g(plan.budgetGiB)}`,
    `model weights take ${g(plan.weightsGiB)}; non_torch_memory takes ${g(plan.nonTorchGiB)}; PyTorch activation ` +
      `peak memory takes ${g(plan.activationGiB)}; the rest of the memory reserved for KV Cache is ` +
      `${g(plan.budgetGiB - plan.weightsGiB - plan.nonTorchGiB - plan.activationGiB - plan.graphsGiB)}.`,
  ].join('\n')
}

/**
 * freeMemoryError is `request_memory`'s refusal; newer releases name the device (`cuda:1`, the rank's
 * local device index).
 */
export function freeMemoryError(
  freeGiB: number,
  totalGiB: number,
  utilization: number,
  desiredGiB: number,
  device?: string,
): string {
  return (
    `ValueError: Free memory on device ${device ? `${device} ` : ''}(${pyRound(freeGiB)}/${pyRound(totalGiB)} GiB) on startup is less than ` +
    `desired GPU memory utilization (${utilization}, ${pyRound(desiredGiB)} GiB). Decrease GPU memory ` +
    'utilization or reduce GPU memory used by other processes.'
  )
}

export function maxModelLenError(requested: number, model: ModelSpec): string {
  return (
    `ValueError: User-specified max_model_len (${requested}) is greater than the derived max_model_len ` +
    `(max_position_embeddings=${model.maxModelLen} or model_max_length=None in model's config.json). To allow ` +
    'overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN ' +
    'must be used with extreme caution. If the model uses relative position encoding (RoPE), positions exceeding ' +
    'derived_max_model_len lead to nan. If the model uses absolute position encoding, positions exceeding ' +
    'derived_max_model_len will cause a CUDA array out-of-bounds error.'
  )
}

export const ROUTE_LINES: [string, string][] = [
  ['/health', 'GET'],
  ['/metrics', 'GET'],
  ['/tokenize', 'POST'],
  ['/detokenize', 'POST'],
  ['/v1/models', 'GET'],
  ['/version', 'GET'],
  ['/v1/chat/completions', 'POST'],
  ['/v1/completions', 'POST'],
  ['/v1/embeddings', 'POST'],
  ['/pooling', 'POST'],
  ['/classify', 'POST'],
  ['/score', 'POST'],
  ['/v1/score', 'POST'],
  ['/rerank', 'POST'],
  ['/v1/rerank', 'POST'],
  ['/v2/rerank', 'POST'],
]

export const DEV_ROUTE_LINES: [string, string][] = [
  ['/sleep', 'POST'],
  ['/wake_up', 'POST'],
  ['/is_sleeping', 'GET'],
  ['/collective_rpc', 'POST'],
  ['/reset_prefix_cache', 'POST'],
]

/** StartupMemory is what a worker's start-up memory summary reports (GiB unless said otherwise). */
export interface StartupMemory {
  freeGiB: number
  totalGiB: number
  utilization: number
  weightsGiB: number
  nonTorchGiB: number
  activationGiB: number
  graphsGiB: number
  kvGiB: number
}

/**
 * startupMemoryLine is the worker's informational summary after CUDA-graph capture (not an error):
 * the 0.10/0.11 wording with byte figures, or the later one with GiB figures and the consumed memory
 * (weights + non-torch) summed.
 */
export function startupMemoryLine(style: 'bytes' | 'gib', m: StartupMemory): string {
  const GIB = 2 ** 30
  const desired = m.utilization * m.totalGiB
  const fit = Math.max(0, desired - m.weightsGiB - m.nonTorchGiB - m.activationGiB - m.graphsGiB)
  const full = Math.max(0, m.freeGiB - m.weightsGiB - m.nonTorchGiB - m.activationGiB - m.graphsGiB)
  const bytes = (gib: number) => Math.floor(gib * GIB)
  const head =
    `Free memory on device (${pyRound(m.freeGiB)}/${pyRound(m.totalGiB)} GiB) on startup. Desired GPU memory ` +
    `utilization is (${m.utilization}, ${pyRound(desired)} GiB). `
  if (style === 'bytes') {
    return (
      head +
      `Actual usage is ${pyRound(m.weightsGiB)} GiB for weight, ${pyRound(m.activationGiB)} GiB for peak activation, ` +
      `${pyRound(m.nonTorchGiB)} GiB for non-torch memory, and ${pyRound(m.graphsGiB)} GiB for CUDAGraph memory. ` +
      `Replace gpu_memory_utilization config with \`--kv-cache-memory=${bytes(fit)}\` to fit into requested memory, ` +
      `or \`--kv-cache-memory=${bytes(full)}\` to fully utilize gpu memory. Current kv cache memory in use is ` +
      `${bytes(m.kvGiB)} bytes.`
    )
  }
  return (
    head +
    `Actual usage is ${pyRound(m.weightsGiB + m.nonTorchGiB)} GiB for consumed memory (weights + non-torch), ` +
    `${pyRound(m.activationGiB)} GiB for peak activation, and ${pyRound(m.graphsGiB)} GiB for CUDAGraph memory. ` +
    `Replace gpu_memory_utilization config with \`--kv-cache-memory=${bytes(fit)}\` (${pyRound(fit)} GiB) to fit ` +
    `into requested memory, or \`--kv-cache-memory=${bytes(full)}\` (${pyRound(full)} GiB) to fully utilize gpu ` +
    `memory. Current kv cache memory in use is ${pyRound(m.kvGiB)} GiB.`
  )
}

/** kvCapacityLines are the KV-cache size and concurrency lines, separate (older) or merged (newer). */
export function kvCapacityLines(
  merged: boolean,
  kvTokens: number,
  maxModelLen: number,
  concurrency: number,
): string[] {
  const size = `GPU KV cache size: ${thousands(kvTokens)} tokens`
  const conc = `Maximum concurrency for ${thousands(maxModelLen)} tokens per request: ${concurrency.toFixed(2)}x`
  return merged ? [`${size}, ${conc}`] : [size, conc]
}

export function thousands(n: number): string {
  return Math.trunc(n).toLocaleString('en-US')
}
