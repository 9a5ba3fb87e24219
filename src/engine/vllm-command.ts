import { cudaEnv, hasFlag } from './argv.ts'

/**
 * vllm-command builds the argv and environment of a `vllm serve` launch (the vLLM driver's). It
 * exists so the launch rules of ENGINE-NOTES live in one place: integer CUDA_VISIBLE_DEVICES in PCI
 * order (argv.ts cudaEnv), sleep mode needing both a flag and an env var, and a shared-cache engine
 * getting its own kvcached segment name and no `--gpu-memory-utilization`.
 */

export interface VllmArgsOptions {
  modelPath: string
  port: number
  host?: string
  servedModelName?: string | string[]
  maxModelLen?: number
  gpuMemoryUtilization?: number
  tensorParallelSize?: number
  enableSleepMode?: boolean
  sharedCache?: boolean
  /**
   * otlpTracesEndpoint: vLLM's own traces go there (`--otlp-traces-endpoint`), joining modelgate's
   * trace of each request through the `traceparent` the proxy forwards. Not added when the extra
   * args already carry the flag: the operator's own value wins.
   */
  otlpTracesEndpoint?: string | null
  extraArgs?: string[]
}

/** buildVllmArgs returns the arguments after `vllm serve` (the model comes first). */
export function buildVllmArgs(opts: VllmArgsOptions): string[] {
  const args = [opts.modelPath, '--port', String(opts.port)]
  if (opts.host !== undefined) args.push('--host', opts.host)
  const names = opts.servedModelName === undefined ? [] : [opts.servedModelName].flat()
  if (names.length > 0) args.push('--served-model-name', ...names)
  if (opts.maxModelLen !== undefined) args.push('--max-model-len', String(opts.maxModelLen))
  if (opts.gpuMemoryUtilization !== undefined && !opts.sharedCache) {
    args.push('--gpu-memory-utilization', String(opts.gpuMemoryUtilization))
  }
  if (opts.tensorParallelSize !== undefined && opts.tensorParallelSize > 1) {
    args.push('--tensor-parallel-size', String(opts.tensorParallelSize))
  }
  if (opts.enableSleepMode) args.push('--enable-sleep-mode')
  if (opts.otlpTracesEndpoint && !hasFlag(opts.extraArgs ?? [], '--otlp-traces-endpoint'))
    args.push('--otlp-traces-endpoint', opts.otlpTracesEndpoint)
  if (opts.extraArgs) args.push(...opts.extraArgs)
  return args
}

export interface EngineEnvOptions {
  gpuIds: number[]
  enableSleepMode?: boolean
  sharedCache?: boolean
  /**
   * sharedCacheName: this engine's own kvcached segment (KVCACHED_IPC_NAME). kvcached keeps one
   * segment per engine, so it must never be shared with another engine; without it kvcached names
   * the segment itself (`kvcached_<engine>_<pgid>`, also per engine, but unknown to the gateway).
   */
  sharedCacheName?: string
}

/** buildEngineEnv returns the variables to add to the engine's environment. */
export function buildEngineEnv(opts: EngineEnvOptions): Record<string, string> {
  const env = cudaEnv(opts.gpuIds)
  if (opts.enableSleepMode) env.VLLM_SERVER_DEV_MODE = '1'
  if (opts.sharedCache) {
    env.ENABLE_KVCACHED = 'true'
    env.KVCACHED_AUTOPATCH = '1'
    if (opts.sharedCacheName) env.KVCACHED_IPC_NAME = opts.sharedCacheName
  }
  return env
}

const DECIMAL_SUFFIX: Record<string, number> = { k: 1e3, m: 1e6, g: 1e9, t: 1e12 }
const BINARY_SUFFIX: Record<string, number> = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 }

/**
 * parseHumanInt reads an integer the way vLLM's `human_readable_int` does: `32k` = 32000,
 * `25.6k` = 25600, `32K` = 32768 (binary suffixes take integers only), `1m`, `1M`, plain integers.
 * Returns null for anything vLLM would reject.
 */
export function parseHumanInt(value: string): number | null {
  const s = value.trim()
  const m = /^(\d+(?:\.\d+)?)([kKmMgGtT])$/.exec(s)
  if (m) {
    const [, number = '', suffix = ''] = m
    const decimal = DECIMAL_SUFFIX[suffix]
    if (decimal !== undefined) return Math.trunc(Number(number) * decimal)
    if (number.includes('.')) return null
    return Number(number) * (BINARY_SUFFIX[suffix] ?? 1)
  }
  return /^[+-]?\d+$/.test(s) ? Number(s) : null
}
