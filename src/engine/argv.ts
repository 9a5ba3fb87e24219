/**
 * argv holds what every engine's command line shares: reading flags back out of operator-supplied
 * extra args (`--x v`, `--x=v`, underscores or dashes, as Python's argparse reads them), dropping
 * them, quoting a command for display, and the CUDA device choice every engine on a GPU gets.
 */

/**
 * cudaEnv: the GPUs an engine may use. Integer indices in PCI bus order, so they match nvidia-smi's
 * (UUIDs crash vLLM; CUDA's default order is fastest-first, not nvidia-smi's); tensor-parallel ranks
 * take the first N visible.
 */
export function cudaEnv(gpuIds: readonly number[]): Record<string, string> {
  return {
    CUDA_VISIBLE_DEVICES: gpuIds.map((id) => String(Math.trunc(id))).join(','),
    CUDA_DEVICE_ORDER: 'PCI_BUS_ID',
  }
}

const SHELL_SAFE = /^[\w@%+=:,./-]+$/

/** quoteCommand renders argv as one POSIX-shell-safe line, for the launch_command field and logs. */
export function quoteCommand(argv: readonly string[]): string {
  return argv.map((arg) => (SHELL_SAFE.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`)).join(' ')
}

/** normalizeFlag spells `--max_model_len` as `--max-model-len`, as argparse-based engines (vLLM, SGLang) accept both. */
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

/**
 * abbreviationIn: the first arg of `args` that Python's argparse, which vLLM's and SGLang's parsers
 * are (allow_abbrev on), would read as one of `flags` without spelling it: a strict prefix of it
 * (`--ho` for `--host`, `--gpu-memory=0.9` for `--gpu-memory-utilization`, `-t` for `-tp`),
 * underscores read as dashes, unless the arg is itself one of `flags`. argparse takes a prefix that
 * is unique among all of the parser's options; modelgate does not know every option of every engine
 * build, so any prefix of one of `flags` counts (a prefix that is ambiguous to the engine would
 * fail its start anyway). Nothing after `--` is a flag. Null when there is none.
 */
export function abbreviationIn(
  args: readonly string[],
  flags: readonly string[],
): { arg: string; flag: string } | null {
  const known = flags.map(normalizeFlag)
  const exact = new Set(known)
  for (const arg of args) {
    if (arg === '--') break
    if (!arg.startsWith('-')) continue
    const eq = arg.indexOf('=')
    const name = normalizeFlag(eq > 0 ? arg.slice(0, eq) : arg)
    const dashes = name.startsWith('--') ? 2 : 1
    if (name.length <= dashes || exact.has(name)) continue
    const flag = known.find((f) => f.startsWith(name) && (f.startsWith('--') ? 2 : 1) === dashes)
    if (flag) return { arg: eq > 0 ? arg.slice(0, eq) : arg, flag }
  }
  return null
}

/** removeFlag drops every occurrence of a flag and its value, so the gateway can merge its own. */
export function removeFlag(args: readonly string[], flag: string, opts: FlagOptions = {}): string[] {
  const drop = new Set<number>()
  for (const hit of findFlagHits(args, flag, opts)) {
    for (let k = 0; k < hit.span; k++) drop.add(hit.index + k)
  }
  return args.filter((_, i) => !drop.has(i))
}
