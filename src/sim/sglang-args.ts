/**
 * parseSglangArgs reads a `python -m sglang.launch_server` command line as SGLang's argparse
 * parser does (srt/server_args.py add_cli_args) for the flags the simulator acts on, and accepts a
 * list of other real flags. Unlike vLLM's simulator it refuses a flag it does not know, as
 * argparse does for SGLang (`launch_server.py: error: unrecognized arguments: …`, exit 2): the
 * gateway must not pass an engine a flag of another engine.
 */
export interface SglangArgs {
  modelPath: string
  servedModelName: string
  host: string
  port: number
  /** --mem-fraction-static; undefined: SGLang picks one from the GPU's size */
  memFractionStatic: number | undefined
  contextLength: number | undefined
  tpSize: number
  maxRunningRequests: number | undefined
  enableMemorySaver: boolean
  enableWeightsCpuBackup: boolean
  enableMetrics: boolean
  skipServerWarmup: boolean
  disableCudaGraph: boolean
  logLevel: string
  /** every flag given, for the `server_args=ServerArgs(…)` line */
  given: [string, string | boolean][]
}

export class SglangArgumentError extends Error {}

const BOOLEAN = new Set([
  'enable-memory-saver',
  'enable-weights-cpu-backup',
  'enable-draft-weights-cpu-backup',
  'enable-metrics',
  'skip-server-warmup',
  'disable-cuda-graph',
  'trust-remote-code',
  'disable-radix-cache',
  'enable-torch-compile',
  'enable-cache-report',
  'disable-overlap-schedule',
  'enable-mixed-chunk',
  'skip-tokenizer-init',
  'enable-dp-attention',
  'is-embedding',
  'log-requests',
  'enable-p2p-check',
  'disable-custom-all-reduce',
])

const VALUED = new Set([
  'model-path',
  'tokenizer-path',
  'served-model-name',
  'host',
  'port',
  'mem-fraction-static',
  'context-length',
  'tp-size',
  'dp-size',
  'max-running-requests',
  'max-total-tokens',
  'chunked-prefill-size',
  'max-prefill-tokens',
  'schedule-policy',
  'dtype',
  'kv-cache-dtype',
  'quantization',
  'attention-backend',
  'sampling-backend',
  'cuda-graph-max-bs',
  'random-seed',
  'log-level',
  'log-level-http',
  'api-key',
  'chat-template',
  'tool-call-parser',
  'reasoning-parser',
  'revision',
  'download-dir',
  'load-format',
  'base-gpu-id',
  'watchdog-timeout',
  'stream-interval',
  'page-size',
])

const ALIASES: Record<string, string> = {
  model: 'model-path',
  'tensor-parallel-size': 'tp-size',
  tp: 'tp-size',
  'data-parallel-size': 'dp-size',
  dp: 'dp-size',
}

export function parseSglangArgs(argv: string[]): SglangArgs {
  const values = new Map<string, string | true>()
  const unknown: string[] = []
  const given: [string, string | boolean][] = []
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i] ?? ''
    if (!token.startsWith('--')) {
      unknown.push(token)
      continue
    }
    const eq = token.indexOf('=')
    let name = (eq >= 0 ? token.slice(2, eq) : token.slice(2)).replaceAll('_', '-')
    name = ALIASES[name] ?? name
    if (BOOLEAN.has(name)) {
      if (eq >= 0)
        throw new SglangArgumentError(
          `argument --${name}: ignored explicit argument '${token.slice(eq + 1)}'`,
        )
      values.set(name, true)
      given.push([name, true])
    } else if (VALUED.has(name)) {
      const value = eq >= 0 ? token.slice(eq + 1) : argv[++i]
      if (value === undefined || (eq < 0 && value.startsWith('--')))
        throw new SglangArgumentError(`argument --${name}: expected one argument`)
      values.set(name, value)
      given.push([name, value])
    } else unknown.push(token)
  }
  if (unknown.length) throw new SglangArgumentError(`unrecognized arguments: ${unknown.join(' ')}`)
  const str = (name: string): string | undefined => {
    const v = values.get(name)
    return v === true ? undefined : v
  }
  const int = (name: string): number | undefined => {
    const raw = str(name)
    if (raw === undefined) return undefined
    if (!/^-?\d+$/.test(raw)) throw new SglangArgumentError(`argument --${name}: invalid int value: '${raw}'`)
    return Number(raw)
  }
  const float = (name: string): number | undefined => {
    const raw = str(name)
    if (raw === undefined) return undefined
    const n = Number(raw)
    if (raw.trim() === '' || !Number.isFinite(n))
      throw new SglangArgumentError(`argument --${name}: invalid float value: '${raw}'`)
    return n
  }
  const modelPath = str('model-path')
  if (!modelPath) throw new SglangArgumentError('the following arguments are required: --model-path')
  return {
    modelPath,
    servedModelName: str('served-model-name') ?? modelPath,
    host: str('host') ?? '127.0.0.1',
    port: int('port') ?? 30000,
    memFractionStatic: float('mem-fraction-static'),
    contextLength: int('context-length'),
    tpSize: int('tp-size') ?? 1,
    maxRunningRequests: int('max-running-requests'),
    enableMemorySaver: values.get('enable-memory-saver') === true,
    enableWeightsCpuBackup: values.get('enable-weights-cpu-backup') === true,
    enableMetrics: values.get('enable-metrics') === true,
    skipServerWarmup: values.get('skip-server-warmup') === true,
    disableCudaGraph: values.get('disable-cuda-graph') === true,
    logLevel: str('log-level') ?? 'info',
    given,
  }
}

/** serverArgsLine: SGLang's first log line, `server_args=ServerArgs(model_path='…', …)` (abridged). */
export function serverArgsLine(a: SglangArgs, memFraction: number): string {
  const py = (v: string | number | boolean | undefined) =>
    v === undefined
      ? 'None'
      : typeof v === 'boolean'
        ? v
          ? 'True'
          : 'False'
        : typeof v === 'number'
          ? String(v)
          : `'${v}'`
  return (
    `server_args=ServerArgs(model_path=${py(a.modelPath)}, tokenizer_path=${py(a.modelPath)}, ` +
    `host=${py(a.host)}, port=${a.port}, mem_fraction_static=${memFraction}, ` +
    `max_running_requests=${py(a.maxRunningRequests)}, tp_size=${a.tpSize}, ` +
    `context_length=${py(a.contextLength)}, served_model_name=${py(a.servedModelName)}, ` +
    `enable_metrics=${py(a.enableMetrics)}, enable_memory_saver=${py(a.enableMemorySaver)}, ` +
    `enable_weights_cpu_backup=${py(a.enableWeightsCpuBackup)}, log_level=${py(a.logLevel)})`
  )
}
