/**
 * vllm-command builds the argv and environment of a `vllm serve` launch, and reads flags back out of
 * operator-supplied extra args. It exists so the launch rules of ENGINE-NOTES live in one place:
 * integer CUDA_VISIBLE_DEVICES in PCI order, sleep mode needing both a flag and an env var, and a
 * shared-cache engine getting its own kvcached segment name and no `--gpu-memory-utilization`.
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
  const env: Record<string, string> = {
    CUDA_VISIBLE_DEVICES: opts.gpuIds.map((id) => String(Math.trunc(id))).join(','),
    CUDA_DEVICE_ORDER: 'PCI_BUS_ID',
  }
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

const SHELL_SAFE = /^[\w@%+=:,./-]+$/

/** quoteCommand renders argv as one POSIX-shell-safe line, for the launch_command field and logs. */
export function quoteCommand(argv: readonly string[]): string {
  return argv.map((arg) => (SHELL_SAFE.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`)).join(' ')
}

/** normalizeFlag spells `--max_model_len` as `--max-model-len`, as vLLM's parser does. */
function normalizeFlag(flag: string): string {
  return flag.startsWith('--') ? `--${flag.slice(2).replaceAll('_', '-')}` : flag
}

/** FlagOptions: `aliases` adds short forms such as `-tp`; `takesValue: false` marks a boolean flag. */
export interface FlagOptions {
  aliases?: readonly string[]
  takesValue?: boolean
}

interface FlagHit {
  /** index of the flag in args */
  index: number
  /** how many args the occurrence spans (1 for `--x=v` or a bare flag, 2 for `--x v`) */
  span: number
  value: string | null
}

function findFlagHits(args: readonly string[], flag: string, opts: FlagOptions): FlagHit[] {
  const wanted = new Set([flag, ...(opts.aliases ?? [])].map(normalizeFlag))
  const hits: FlagHit[] = []
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? ''
    if (arg === '--') break
    const eq = arg.indexOf('=')
    const name = normalizeFlag(eq > 0 ? arg.slice(0, eq) : arg)
    if (!wanted.has(name)) continue
    if (eq > 0) {
      hits.push({ index: i, span: 1, value: arg.slice(eq + 1) })
      continue
    }
    const next = args[i + 1]
    const isValue = next !== undefined && (!next.startsWith('-') || /^-\d/.test(next))
    const takesNext = opts.takesValue !== false && isValue
    hits.push({ index: i, span: takesNext ? 2 : 1, value: takesNext ? (next ?? null) : null })
    if (takesNext) i++
  }
  return hits
}

/**
 * findFlagValue returns the value of a flag in extra args (`--x=v` or `--x v`; underscores or
 * dashes; the last occurrence wins, as with argparse), '' for a bare flag, undefined when absent.
 */
export function findFlagValue(
  args: readonly string[],
  flag: string,
  opts: FlagOptions = {},
): string | undefined {
  const last = findFlagHits(args, flag, opts).at(-1)
  if (!last) return undefined
  return last.value ?? ''
}

/** hasFlag says whether a flag occurs in args in any form. */
export function hasFlag(args: readonly string[], flag: string, opts: FlagOptions = {}): boolean {
  return findFlagHits(args, flag, opts).length > 0
}

/** removeFlag drops every occurrence of a flag and its value, so the gateway can merge its own. */
export function removeFlag(args: readonly string[], flag: string, opts: FlagOptions = {}): string[] {
  const drop = new Set<number>()
  for (const hit of findFlagHits(args, flag, opts)) {
    for (let k = 0; k < hit.span; k++) drop.add(hit.index + k)
  }
  return args.filter((_, i) => !drop.has(i))
}
