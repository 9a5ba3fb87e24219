import { abortable } from '../host/abortable.ts'
/**
 * smi asks nvidia-smi (or anything answering the same queries, such as `modelgate sim smi`) what
 * GPUs exist and what runs on them. Parsing never throws: `[N/A]`, `[Not Supported]` and friends
 * become null, malformed rows are skipped, and a missing or hung binary is an "unavailable"
 * snapshot with a readable reason rather than an exception.
 */

export const GPU_QUERY_FIELDS = [
  'index',
  'uuid',
  'name',
  'memory.total',
  'memory.used',
  'memory.free',
  'utilization.gpu',
  'temperature.gpu',
] as const

export const APP_QUERY_FIELDS = ['pid', 'process_name', 'used_memory', 'gpu_uuid'] as const

const CSV_FORMAT = '--format=csv,noheader,nounits'

export function gpuQueryArgs(): string[] {
  return [`--query-gpu=${GPU_QUERY_FIELDS.join(',')}`, CSV_FORMAT]
}

export function appQueryArgs(): string[] {
  return [`--query-compute-apps=${APP_QUERY_FIELDS.join(',')}`, CSV_FORMAT]
}

/** GpuInfo is one row of the GPU query; memory in MiB, as nvidia-smi reports it. */
export interface GpuInfo {
  index: number
  uuid: string
  name: string
  memoryTotalMib: number | null
  memoryUsedMib: number | null
  memoryFreeMib: number | null
  utilizationPercent: number | null
  temperatureC: number | null
}

/** GpuApp is one compute process; its pid is only a hint (containers see other PID namespaces). */
export interface GpuApp {
  pid: number | null
  processName: string
  usedMemoryMib: number | null
  gpuUuid: string
}

const UNIT_TO_MIB: Record<string, number> = { kib: 1 / 1024, mib: 1, gib: 1024, tib: 1024 * 1024 }

/** parseSmiNumber reads `81559`, `81559 MiB`, `12 %`, `34 C`; null for `[N/A]`, empty or garbage. */
export function parseSmiNumber(value: string | undefined): number | null {
  const m = /^(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$/.exec((value ?? '').trim())
  if (!m) return null
  const n = Number(m[1])
  const factor = UNIT_TO_MIB[(m[2] ?? '').toLowerCase()] ?? 1
  return Number.isFinite(n) ? n * factor : null
}

function parseText(value: string | undefined): string {
  const s = (value ?? '').trim()
  return /^\[.*\]$|^N\/A$/i.test(s) ? '' : s
}

function rows(text: string): string[][] {
  return text
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line !== '')
    .map((line) => line.split(','))
}

/** parseGpuCsv reads the GPU query; a name with commas is rejoined, rows without an index skipped. */
export function parseGpuCsv(text: string): GpuInfo[] {
  const out: GpuInfo[] = []
  const tail = GPU_QUERY_FIELDS.length - 3
  for (const cells of rows(text)) {
    const index = parseSmiNumber(cells[0])
    if (index === null || !Number.isInteger(index) || index < 0 || cells.length < 3) continue
    const nameEnd = Math.max(3, cells.length - tail)
    const rest = cells.slice(nameEnd)
    out.push({
      index,
      uuid: parseText(cells[1]),
      name: parseText(cells.slice(2, nameEnd).join(',')),
      memoryTotalMib: parseSmiNumber(rest[0]),
      memoryUsedMib: parseSmiNumber(rest[1]),
      memoryFreeMib: parseSmiNumber(rest[2]),
      utilizationPercent: parseSmiNumber(rest[3]),
      temperatureC: parseSmiNumber(rest[4]),
    })
  }
  return out
}

/** parseAppsCsv reads the compute-apps query; a process name with commas is rejoined. */
export function parseAppsCsv(text: string): GpuApp[] {
  const out: GpuApp[] = []
  for (const cells of rows(text)) {
    if (cells.length < APP_QUERY_FIELDS.length) continue
    out.push({
      pid: parseSmiNumber(cells[0]),
      processName: parseText(cells.slice(1, -2).join(',')),
      usedMemoryMib: parseSmiNumber(cells.at(-2)),
      gpuUuid: parseText(cells.at(-1)),
    })
  }
  return out
}

export type GpuSnapshot =
  | { available: true; gpus: GpuInfo[]; apps: GpuApp[]; takenAt: number }
  | { available: false; reason: string }

export interface GpuProbeOptions {
  /** timeoutMs bounds each query; a hung nvidia-smi is killed. Default 5000. */
  timeoutMs?: number
  /** cacheMs is how long a snapshot is reused. Default 500. */
  cacheMs?: number
}

type RunResult = { ok: true; stdout: string } | { ok: false; reason: string }

/**
 * GpuProbe runs the configured query command (`['nvidia-smi']`, or the simulator) and returns a
 * snapshot. Snapshots are cached for cacheMs and concurrent callers share one in-flight probe, so
 * a burst of dashboard requests runs nvidia-smi once. A failing compute-apps query degrades to an
 * empty app list; a failing GPU query makes the snapshot unavailable.
 */
export class GpuProbe {
  private readonly timeoutMs: number
  private readonly cacheMs: number
  private cached: { snapshot: GpuSnapshot; at: number } | null = null
  private inflight: Promise<GpuSnapshot> | null = null
  /** last: the newest reading taken, whatever its age (null before the first); what views are served. */
  private last: GpuSnapshot | null = null
  /** changed: invalidate() was called since `last` was taken: it shows the GPUs as they no longer are. */
  private changed = false
  /** generation: bumped by invalidate, so a probe that began before it is not reused. */
  private generation = 0

  constructor(
    private readonly command: string[] | null,
    opts: GpuProbeOptions = {},
  ) {
    this.timeoutMs = opts.timeoutMs ?? 5000
    this.cacheMs = opts.cacheMs ?? 500
  }

  /**
   * invalidate drops the cached snapshot so the next one reflects a change we just made. A probe
   * already running started before the change: its answer is neither joined nor cached afterwards
   * (it may read the GPU as it was: seen as a wake that "freed" memory it had just taken back).
   */
  invalidate(): void {
    this.cached = null
    this.inflight = null
    this.generation++
    this.changed = true
  }

  async snapshot(): Promise<GpuSnapshot> {
    if (this.cached && Date.now() - this.cached.at < this.cacheMs) return this.cached.snapshot
    if (this.inflight) return this.inflight
    const generation = this.generation
    const running = this.probe().then((snapshot) => {
      if (this.generation === generation) {
        this.cached = { snapshot, at: Date.now() }
        this.inflight = null
        this.last = snapshot
        this.changed = false
      } else this.last ??= snapshot
      return snapshot
    })
    this.inflight = running
    return running
  }

  /**
   * reading: what a view shows (a metrics scrape, the GPU and memory pages, a heartbeat): the newest
   * reading at once, however old (its `takenAt` says), while a fresh one is taken in the background
   * once it is older than cacheMs, one for every caller. So a view never waits for nvidia-smi (one
   * run can take seconds on a busy host), except for the first reading after start and the first
   * after a change modelgate made itself (invalidate: a load, sleep, wake or unload), which the last
   * reading no longer shows. What decides (a load's placement, a footprint, a sleep check) asks
   * snapshot() instead.
   */
  async reading(): Promise<GpuSnapshot> {
    const last = this.last
    if (last === null || this.changed) return this.snapshot()
    if (!(this.cached && Date.now() - this.cached.at < this.cacheMs)) this.snapshot().catch(() => undefined)
    return last
  }

  private async probe(): Promise<GpuSnapshot> {
    const command = this.command
    if (!command || command.length === 0) return { available: false, reason: 'no GPU probe configured' }
    const [gpuRun, appRun] = await Promise.all([
      this.run([...command, ...gpuQueryArgs()]),
      this.run([...command, ...appQueryArgs()]),
    ])
    if (!gpuRun.ok) return { available: false, reason: gpuRun.reason }
    return {
      available: true,
      gpus: parseGpuCsv(gpuRun.stdout),
      apps: appRun.ok ? parseAppsCsv(appRun.stdout) : [],
      takenAt: Date.now(),
    }
  }

  private async run(argv: string[]): Promise<RunResult> {
    const program = argv[0] ?? ''
    const shown = this.command?.join(' ') ?? program
    let proc: Bun.Subprocess<'ignore', 'pipe', 'pipe'>
    try {
      proc = Bun.spawn(argv, { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
    } catch (err) {
      const code = (err as { code?: string }).code
      const what = code === 'ENOENT' ? 'not found' : code === 'EACCES' ? 'not executable' : 'failed to start'
      return { ok: false, reason: `${basename(program)} ${what} (command: ${shown})` }
    }
    const finished = Promise.all([
      proc.exited,
      new Response(proc.stdout).text(),
      new Response(proc.stderr).text(),
    ]).catch(() => null)
    const outcome = await abortable(finished, { timeoutMs: this.timeoutMs }).catch(() => 'timeout' as const)
    if (outcome === 'timeout' || outcome === null) {
      proc.kill('SIGKILL')
      const why = outcome === 'timeout' ? `timed out after ${this.timeoutMs} ms` : 'output could not be read'
      return { ok: false, reason: `${basename(program)} ${why} (command: ${shown})` }
    }
    const [exitCode, stdout, stderr] = outcome
    if (exitCode !== 0) {
      const detail = firstLine(stderr) || firstLine(stdout)
      const suffix = detail ? `: ${detail}` : ''
      return {
        ok: false,
        reason: `${basename(program)} exited with code ${exitCode}${suffix} (command: ${shown})`,
      }
    }
    return { ok: true, stdout }
  }
}

function basename(path: string): string {
  return path.split('/').at(-1) || path
}

function firstLine(text: string): string {
  return (
    text
      .split(/\r?\n/)
      .map((l) => l.trim())
      .find((l) => l !== '') ?? ''
  )
}
