/** Number formats shared by the pages: memory in GiB (the views' `_gb` figures are GiB), times, shares. */
export function gib(n: number | null | undefined, digits = 1): string {
  if (n === null || n === undefined || Number.isNaN(n)) return '—'
  return `${n.toFixed(digits)} GiB`
}

export function percent(part: number, whole: number): string {
  if (!whole) return '0%'
  return `${Math.round((part / whole) * 100)}%`
}

export function ms(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—'
  return n < 1000 ? `${Math.round(n)} ms` : `${(n / 1000).toFixed(2)} s`
}

/** since: how long ago an ISO time was, coarse ("3 min ago"). */
export function since(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—'
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000))
  if (s < 60) return `${s} s ago`
  if (s < 3600) return `${Math.round(s / 60)} min ago`
  if (s < 86400) return `${Math.round(s / 3600)} h ago`
  return `${Math.round(s / 86400)} d ago`
}

/** shortName: the last segment of a model path (`Qwen/Qwen2.5-7B` → `Qwen2.5-7B`). */
export function shortName(modelPath: string): string {
  return modelPath.replace(/\/+$/, '').split('/').at(-1) || modelPath
}

/** splitArgs splits a command line into arguments as a shell would for quotes: `--x="a b"` is one. */
export function splitArgs(text: string): string[] {
  const out: string[] = []
  let arg: string | null = null
  let quote: string | null = null
  for (const c of text) {
    if (quote) {
      if (c === quote) quote = null
      else arg += c
    } else if (c === '"' || c === "'") {
      quote = c
      arg ??= ''
    } else if (/\s/.test(c)) {
      if (arg !== null) out.push(arg)
      arg = null
    } else arg = (arg ?? '') + c
  }
  if (arg !== null) out.push(arg)
  return out
}

/**
 * tick: a y-axis figure with as many digits as it takes to tell it from its neighbours (three
 * significant ones), so a chart of small values (a KV-cache use of 0.002) does not read 0, 0, 0.
 */
export function tick(v: number): string {
  if (v === 0 || !Number.isFinite(v)) return String(v)
  const abs = Math.abs(v)
  if (abs >= 1000) return Math.round(v).toLocaleString('en-US')
  return String(Number(v.toPrecision(3)))
}
