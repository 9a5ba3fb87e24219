/**
 * ModelSpec is what the simulator needs to know about a model to fake its memory figures: parameter
 * count (weights), context length and KV bytes per token. Well-known names carry their real shapes;
 * anything else is guessed from the name so demos can use arbitrary model ids.
 */
export interface ModelSpec {
  name: string
  architecture: string
  paramsB: number
  maxModelLen: number
  layers: number
  kvHeads: number
  headDim: number
  dtypeBytes: number
  task: 'generate' | 'pooling'
}

type Shape = Omit<ModelSpec, 'name' | 'dtypeBytes' | 'task'> & { task?: ModelSpec['task'] }

const KNOWN: Record<string, Shape> = {
  'facebook/opt-125m': {
    architecture: 'OPTForCausalLM',
    paramsB: 0.125,
    maxModelLen: 2048,
    layers: 12,
    kvHeads: 12,
    headDim: 64,
  },
  'Qwen/Qwen2.5-0.5B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 0.494,
    maxModelLen: 32768,
    layers: 24,
    kvHeads: 2,
    headDim: 64,
  },
  'Qwen/Qwen2.5-1.5B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 1.54,
    maxModelLen: 32768,
    layers: 28,
    kvHeads: 2,
    headDim: 128,
  },
  'Qwen/Qwen2.5-7B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 7.62,
    maxModelLen: 32768,
    layers: 28,
    kvHeads: 4,
    headDim: 128,
  },
  'Qwen/Qwen2.5-14B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 14.7,
    maxModelLen: 32768,
    layers: 48,
    kvHeads: 8,
    headDim: 128,
  },
  'Qwen/Qwen2.5-32B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 32.8,
    maxModelLen: 32768,
    layers: 64,
    kvHeads: 8,
    headDim: 128,
  },
  'Qwen/Qwen2.5-72B-Instruct': {
    architecture: 'Qwen2ForCausalLM',
    paramsB: 72.7,
    maxModelLen: 32768,
    layers: 80,
    kvHeads: 8,
    headDim: 128,
  },
  'Qwen/Qwen3-8B': {
    architecture: 'Qwen3ForCausalLM',
    paramsB: 8.19,
    maxModelLen: 40960,
    layers: 36,
    kvHeads: 8,
    headDim: 128,
  },
  'meta-llama/Llama-3.2-1B-Instruct': {
    architecture: 'LlamaForCausalLM',
    paramsB: 1.24,
    maxModelLen: 131072,
    layers: 16,
    kvHeads: 8,
    headDim: 64,
  },
  'meta-llama/Llama-3.2-3B-Instruct': {
    architecture: 'LlamaForCausalLM',
    paramsB: 3.21,
    maxModelLen: 131072,
    layers: 28,
    kvHeads: 8,
    headDim: 128,
  },
  'meta-llama/Llama-3.1-8B-Instruct': {
    architecture: 'LlamaForCausalLM',
    paramsB: 8.03,
    maxModelLen: 131072,
    layers: 32,
    kvHeads: 8,
    headDim: 128,
  },
  'meta-llama/Llama-3.1-70B-Instruct': {
    architecture: 'LlamaForCausalLM',
    paramsB: 70.6,
    maxModelLen: 131072,
    layers: 80,
    kvHeads: 8,
    headDim: 128,
  },
  'mistralai/Mistral-7B-Instruct-v0.3': {
    architecture: 'MistralForCausalLM',
    paramsB: 7.25,
    maxModelLen: 32768,
    layers: 32,
    kvHeads: 8,
    headDim: 128,
  },
  'BAAI/bge-reranker-v2-m3': {
    architecture: 'XLMRobertaForSequenceClassification',
    paramsB: 0.568,
    maxModelLen: 8192,
    layers: 24,
    kvHeads: 16,
    headDim: 64,
    task: 'pooling',
  },
}

const DEFAULT_PARAMS_B = 7

/** paramsFromName finds `7B`, `1.5B`, `13b`, `125m` in a model id; undefined when there is none. */
export function paramsFromName(name: string): number | undefined {
  const match = /(?:^|[-_/.])(\d+(?:\.\d+)?)([bBmM])(?=$|[-_.])/.exec(name)
  if (!match) return undefined
  const n = Number(match[1])
  return match[2]?.toLowerCase() === 'm' ? n / 1000 : n
}

export function lookupModel(name: string): ModelSpec {
  const known =
    KNOWN[name] ?? Object.entries(KNOWN).find(([k]) => k.toLowerCase() === name.toLowerCase())?.[1]
  if (known) return { name, dtypeBytes: 2, task: 'generate', ...known }
  const paramsB = paramsFromName(name) ?? DEFAULT_PARAMS_B
  // Rough Llama-like shape: more layers for bigger models, GQA with 8 KV heads of 128.
  const layers = Math.max(12, Math.round(16 + 8 * Math.log2(paramsB + 1)))
  const pooling = /rerank|embed|bge|e5-|gte-/i.test(name)
  return {
    name,
    architecture: pooling ? 'BertModel' : 'LlamaForCausalLM',
    paramsB,
    maxModelLen: /llama-3/i.test(name) ? 131072 : 32768,
    layers,
    kvHeads: 8,
    headDim: 128,
    dtypeBytes: 2,
    task: pooling ? 'pooling' : 'generate',
  }
}

export const GIB = 2 ** 30

/** weightsGiB is bf16 weight memory for the whole model (split it over TP ranks yourself). */
export function weightsGiB(model: ModelSpec): number {
  return (model.paramsB * 1e9 * model.dtypeBytes) / GIB
}

/** kvBytesPerToken counts K and V for every layer, for the whole model (all TP ranks together). */
export function kvBytesPerToken(model: ModelSpec): number {
  return 2 * model.layers * model.kvHeads * model.headDim * model.dtypeBytes
}
