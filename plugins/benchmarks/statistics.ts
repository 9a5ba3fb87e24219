import { seededRandom } from './random.ts'
import type { RequestSample } from './request.ts'
import type { ScenarioMetrics } from './schemas.ts'

/**
 * Statistics of one scenario, defined as `vllm bench serve` defines them (times in ms):
 *
 * - TTFT = first content chunk − send time; E2E = last content chunk − send time;
 * - per-request TPS = output tokens ÷ (E2E − TTFT) in seconds; TPOT = (E2E − TTFT) ÷ (output − 1);
 *   ITL = gaps between consecutive content chunks;
 * - requests_per_second and tokens_per_second_total divide by the measured phase's wall-clock
 *   duration (first send → last response end), never by a sum of latencies;
 * - percentiles interpolate linearly between closest ranks (numpy's default);
 * - a request is good when it succeeded and met every SLA that was set (E2E ≤ sla_threshold_ms,
 *   TTFT ≤ sla_ttft_ms, TPOT ≤ sla_tpot_ms); goodput_percent is over all measured requests,
 *   failed ones included.
 */

/** percentile of an ascending array, q in [0, 100], linear interpolation; 0 for an empty array. */
export function percentile(sorted: readonly number[], q: number): number {
  const n = sorted.length
  if (n === 0) return 0
  if (n === 1) return sorted[0]!
  const rank = (Math.min(100, Math.max(0, q)) / 100) * (n - 1)
  const lo = Math.floor(rank)
  const hi = Math.min(n - 1, lo + 1)
  const frac = rank - lo
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * frac
}

export function mean(values: readonly number[]): number {
  if (values.length === 0) return 0
  let sum = 0
  for (const v of values) sum += v
  return sum / values.length
}

/** Reservoir keeps a uniform sample of at most `capacity` values (exact below the capacity). */
export class Reservoir {
  private readonly values: number[] = []
  private seen = 0
  private total = 0
  private readonly random: () => number

  constructor(
    private readonly capacity: number,
    seed = 1,
  ) {
    this.random = seededRandom(seed)
  }

  add(v: number): void {
    this.seen++
    this.total += v
    if (this.values.length < this.capacity) {
      this.values.push(v)
      return
    }
    const j = Math.floor(this.random() * this.seen)
    if (j < this.capacity) this.values[j] = v
  }

  get count(): number {
    return this.seen
  }

  /** mean is exact over every value added, not only the sampled ones. */
  mean(): number {
    return this.seen ? this.total / this.seen : 0
  }

  sorted(): number[] {
    return [...this.values].sort((a, b) => a - b)
  }
}

export interface Sla {
  e2eMs: number | null
  ttftMs: number | null
  tpotMs: number | null
}

const ITL_CAPACITY = 200_000
const FIRST_ERRORS = 5
const round = (v: number) => Math.round(v * 1000) / 1000

/**
 * failureStatus: how a failed request is counted in `failed_by_status`: its HTTP status (`"401"`),
 * `"stream"` when a 2xx response's stream failed or carried no content, `"no_response"` when no
 * response head arrived (connection refused or broken, timeout).
 */
export function failureStatus(status: number): string {
  if (status >= 300 || (status > 0 && status < 200)) return String(status)
  return status === 0 ? 'no_response' : 'stream'
}

/** ScenarioRecorder accumulates the measured requests of one scenario. */
export class ScenarioRecorder {
  readonly itl = new Reservoir(ITL_CAPACITY)
  private readonly ttft: number[] = []
  private readonly e2e: number[] = []
  private readonly tps: number[] = []
  private readonly tpot: number[] = []
  private readonly errors = new Map<string, number>()
  private readonly byStatus = new Map<string, number>()
  private readonly firstErrors: string[] = []
  private success = 0
  private failed = 0
  private cancelled = 0
  private good = 0
  private outputTokens = 0
  private inputTokens = 0
  private inputReported = 0
  private usageMissing = 0

  constructor(private readonly sla: Sla) {}

  get successCount(): number {
    return this.success
  }
  get errorCount(): number {
    return this.failed
  }

  add(s: RequestSample): void {
    if (s.cancelled) {
      this.cancelled++
      return
    }
    if (!s.ok) {
      this.failed++
      const key = (s.error ?? 'unknown error').slice(0, 200)
      if (!this.errors.has(key) && this.firstErrors.length < FIRST_ERRORS) this.firstErrors.push(key)
      this.errors.set(key, (this.errors.get(key) ?? 0) + 1)
      const status = failureStatus(s.status)
      this.byStatus.set(status, (this.byStatus.get(status) ?? 0) + 1)
      return
    }
    this.success++
    // ITL, like TTFT and E2E, covers successful requests only.
    if (s.itlGaps) for (const gap of s.itlGaps) this.itl.add(gap)
    this.ttft.push(s.ttftMs)
    this.e2e.push(s.e2eMs)
    this.outputTokens += s.outputTokens
    if (!s.usageReported) this.usageMissing++
    if (s.promptTokens !== null) {
      this.inputTokens += s.promptTokens
      this.inputReported++
    }
    const decodeMs = s.e2eMs - s.ttftMs
    let tpot: number | null = null
    if (s.outputTokens > 1 && decodeMs > 0) {
      this.tps.push(s.outputTokens / (decodeMs / 1000))
      tpot = decodeMs / (s.outputTokens - 1)
      this.tpot.push(tpot)
    }
    const { e2eMs, ttftMs, tpotMs } = this.sla
    const meets =
      (e2eMs === null || s.e2eMs <= e2eMs) &&
      (ttftMs === null || s.ttftMs <= ttftMs) &&
      (tpotMs === null || tpot === null || tpot <= tpotMs)
    if (meets) this.good++
  }

  summarize(durationSec: number): ScenarioMetrics {
    const ttft = [...this.ttft].sort((a, b) => a - b)
    const e2e = [...this.e2e].sort((a, b) => a - b)
    const tps = [...this.tps].sort((a, b) => a - b)
    const tpot = [...this.tpot].sort((a, b) => a - b)
    const itl = this.itl.sorted()
    const measured = this.success + this.failed
    const perSec = (v: number) => (durationSec > 0 ? v / durationSec : 0)
    const errors = [...this.errors.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 10)
      .map(([message, count]) => ({ message, count }))
    // latencies exist only for requests that succeeded: with none, they are null, never 0
    const lat = (v: number) => (this.success > 0 ? round(v) : null)
    return {
      ttft_avg: lat(mean(ttft)),
      ttft_p50: lat(percentile(ttft, 50)),
      ttft_p90: lat(percentile(ttft, 90)),
      ttft_p95: lat(percentile(ttft, 95)),
      ttft_p99: lat(percentile(ttft, 99)),
      ttft_min: lat(ttft[0] ?? 0),
      ttft_max: lat(ttft[ttft.length - 1] ?? 0),
      tps_avg: lat(mean(tps)),
      tps_p50: lat(percentile(tps, 50)),
      tps_p90: lat(percentile(tps, 90)),
      tps_p95: lat(percentile(tps, 95)),
      tps_p99: lat(percentile(tps, 99)),
      e2e_avg: lat(mean(e2e)),
      e2e_p50: lat(percentile(e2e, 50)),
      e2e_p90: lat(percentile(e2e, 90)),
      e2e_p95: lat(percentile(e2e, 95)),
      e2e_p99: lat(percentile(e2e, 99)),
      e2e_min: lat(e2e[0] ?? 0),
      e2e_max: lat(e2e[e2e.length - 1] ?? 0),
      tpot_avg: lat(mean(tpot)),
      tpot_p50: lat(percentile(tpot, 50)),
      tpot_p90: lat(percentile(tpot, 90)),
      tpot_p95: lat(percentile(tpot, 95)),
      tpot_p99: lat(percentile(tpot, 99)),
      itl_avg: lat(this.itl.mean()),
      itl_p50: lat(percentile(itl, 50)),
      itl_p90: lat(percentile(itl, 90)),
      itl_p95: lat(percentile(itl, 95)),
      itl_p99: lat(percentile(itl, 99)),
      goodput_count: this.good,
      goodput_percent: measured > 0 ? round((this.good / measured) * 100) : 0,
      goodput_requests_per_second: round(perSec(this.good)),
      requests_per_second: round(perSec(this.success)),
      tokens_per_second_total: round(perSec(this.outputTokens)),
      total_tokens_per_second: round(perSec(this.outputTokens + this.inputTokens)),
      input_tokens_total: this.inputTokens,
      output_tokens_total: this.outputTokens,
      input_tokens_avg: this.inputReported > 0 ? round(this.inputTokens / this.inputReported) : 0,
      output_tokens_avg: this.success > 0 ? round(this.outputTokens / this.success) : 0,
      duration_seconds: round(durationSec),
      total_requests: measured,
      successful_requests: this.success,
      failed_requests: this.failed,
      cancelled_requests: this.cancelled,
      usage_reported: this.usageMissing === 0,
      sla_threshold_ms: this.sla.e2eMs,
      sla_ttft_ms: this.sla.ttftMs,
      sla_tpot_ms: this.sla.tpotMs,
      errors,
      failed_by_status: Object.fromEntries([...this.byStatus.entries()].sort((a, b) => b[1] - a[1])),
      first_errors: [...this.firstErrors],
    }
  }
}
