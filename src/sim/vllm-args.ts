/**
 * parseVllmArgs reads a `vllm serve` command line the way vLLM's argparse does for the flags the gateway
 * relies on, and accepts (and ignores) every other flag so real command lines work unchanged.
 */
export interface VllmArgs {
  model: string
  servedModelNames: string[]
  host: string
  port: number
  gpuMemoryUtilization: number | undefined
  maxModelLen: number | undefined
  tensorParallelSize: number
  maxNumSeqs: number | undefined
  enableSleepMode: boolean
  disableAccessLog: boolean
  disableLogStats: boolean
  /** Flags that differ from vLLM's defaults, for the `non-default args` log line. */
  nonDefault: [string, string | number | boolean | string[]][]
}

/** ArgumentError is argparse's usage error: vLLM prints it and exits 2. */
export class ArgumentError extends Error {}

const BOOLEAN_FLAGS = new Set([
  'enforce-eager',
  'trust-remote-code',
  'disable-log-requests',
  'enable-log-requests',
  'enable-prefix-caching',
  'enable-chunked-prefill',
  'enable-sleep-mode',
  'disable-log-stats',
  'enable-auto-tool-choice',
  'disable-custom-all-reduce',
  'enable-lora',
  'disable-frontend-multiprocessing',
  'enable-expert-parallel',
  'skip-tokenizer-init',
  'disable-fastapi-docs',
  'enable-prompt-tokens-details',
  'enable-server-load-tracking',
  'enable-force-include-usage',
  'disable-uvicorn-access-log',
  'async-scheduling',
  'headless',
  'disable-sliding-window',
  'disable-cascade-attn',
  'enable-log-outputs',
  'return-tokens-as-token-ids',
  'enable-request-id-headers',
])

const MULTI_VALUE_FLAGS = new Set(['served-model-name'])

/** humanReadableInt mirrors vLLM: k/m/g are powers of 1000, K/M/G powers of 1024 (no decimals). */
export function humanReadableInt(value: string): number {
  const text = value.trim()
  if (text === 'auto') return -1
  const match = /^(\d+(?:\.\d+)?)([kKmMgGtT])$/.exec(text)
  if (match) {
    const number = match[1] ?? ''
    const suffix = match[2] ?? ''
    const decimal: Record<string, number> = { k: 1e3, m: 1e6, g: 1e9, t: 1e12 }
    const binary: Record<string, number> = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 }
    const dec = decimal[suffix]
    if (dec !== undefined) return Math.trunc(Number(number) * dec)
    if (!/^\d+$/.test(number)) {
      throw new ArgumentError(
        `Decimals are not allowed with binary suffixes like ${suffix}. Did you mean to use ${number}${suffix.toLowerCase()} instead?`,
      )
    }
    return Number(number) * (binary[suffix] ?? 1)
  }
  if (!/^-?\d+$/.test(text)) throw new ArgumentError(`invalid human_readable_int value: '${value}'`)
  return Number(text)
}

function isFlag(token: string | undefined): boolean {
  return /^-(?!\d)/.test(token ?? '')
}

export function parseVllmArgs(argv: string[]): VllmArgs {
  const values = new Map<string, string[] | true>()
  const positional: string[] = []
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i] ?? ''
    if (!isFlag(token)) {
      positional.push(token)
      continue
    }
    const eq = token.indexOf('=')
    let name = (eq >= 0 ? token.slice(0, eq) : token).replace(/^-+/, '').replaceAll('_', '-')
    if (name === 'tp') name = 'tensor-parallel-size'
    if (eq >= 0) {
      values.set(name, [token.slice(eq + 1)])
    } else if (BOOLEAN_FLAGS.has(name) || name.startsWith('no-')) {
      values.set(name, true)
    } else if (MULTI_VALUE_FLAGS.has(name)) {
      const list: string[] = []
      while (i + 1 < argv.length && !isFlag(argv[i + 1])) list.push(argv[++i] ?? '')
      if (list.length === 0) throw new ArgumentError(`argument --${name}: expected at least one argument`)
      values.set(name, list)
    } else if (i + 1 < argv.length && !isFlag(argv[i + 1])) {
      values.set(name, [argv[++i] ?? ''])
    } else {
      values.set(name, true)
    }
  }
  const one = (name: string): string | undefined => {
    const v = values.get(name)
    if (v === undefined) return undefined
    if (v === true) throw new ArgumentError(`argument --${name}: expected one argument`)
    return v[0]
  }
  const int = (name: string, parse: (s: string) => number = Number): number | undefined => {
    const raw = one(name)
    if (raw === undefined) return undefined
    let n: number
    try {
      n = parse(raw)
    } catch (err) {
      throw new ArgumentError(`argument --${name}: ${(err as Error).message}`)
    }
    if (!Number.isInteger(n)) throw new ArgumentError(`argument --${name}: invalid int value: '${raw}'`)
    return n
  }

  const model = one('model') ?? positional[0]
  if (!model) throw new ArgumentError('the following arguments are required: model_tag')
  const port = int('port') ?? 8000
  if (port < 0 || port > 65535) throw new ArgumentError(`argument --port: invalid port: ${port}`)
  const utilRaw = one('gpu-memory-utilization')
  const gpuMemoryUtilization = utilRaw === undefined ? undefined : Number(utilRaw)
  if (gpuMemoryUtilization !== undefined && !Number.isFinite(gpuMemoryUtilization)) {
    throw new ArgumentError(`argument --gpu-memory-utilization: invalid float value: '${utilRaw}'`)
  }
  const served = values.get('served-model-name')
  const args: VllmArgs = {
    model,
    servedModelNames: served === undefined || served === true ? [model] : served,
    host: one('host') ?? '127.0.0.1',
    port,
    gpuMemoryUtilization,
    maxModelLen: int('max-model-len', humanReadableInt),
    tensorParallelSize: int('tensor-parallel-size') ?? 1,
    maxNumSeqs: int('max-num-seqs'),
    enableSleepMode: values.get('enable-sleep-mode') === true,
    disableAccessLog: values.get('disable-uvicorn-access-log') === true,
    disableLogStats: values.get('disable-log-stats') === true,
    nonDefault: [],
  }
  if (args.tensorParallelSize < 1) throw new ArgumentError('argument --tensor-parallel-size: must be >= 1')
  args.nonDefault.push(['model_tag', model])
  for (const [name, v] of values) {
    const key = name.replaceAll('-', '_')
    if (v === true) args.nonDefault.push([key, true])
    else if (name === 'served-model-name') args.nonDefault.push([key, v])
    else if (name === 'max-model-len' && args.maxModelLen !== undefined)
      args.nonDefault.push([key, args.maxModelLen])
    else {
      const raw = v[0] ?? ''
      args.nonDefault.push([key, /^-?\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw])
    }
  }
  if (!values.has('model')) args.nonDefault.push(['model', model])
  return args
}

/** pythonRepr renders the non-default args like Python's dict repr, as vLLM's log line does. */
export function pythonRepr(entries: [string, string | number | boolean | string[]][]): string {
  const value = (v: string | number | boolean | string[]): string => {
    if (Array.isArray(v)) return `[${v.map((s) => `'${s}'`).join(', ')}]`
    if (typeof v === 'boolean') return v ? 'True' : 'False'
    if (typeof v === 'number') return String(v)
    return `'${v}'`
  }
  return `{${entries.map(([k, v]) => `'${k}': ${value(v)}`).join(', ')}}`
}
