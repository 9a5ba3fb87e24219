/**
 * TimeRing keeps the last hour of the dashboard's time series in constant memory: one slot every
 * SAMPLE_INTERVAL_MS, SAMPLES_KEPT slots (720: an hour at 5 s), one Float64Array per series (NaN:
 * no value), at most MAX_SERIES series (a series per model for KV-cache use and GPU memory, plus
 * the six totals). Memory is at most (MAX_SERIES + 1) × SAMPLES_KEPT × 8 bytes = 374 KB, whatever
 * the traffic and however long modelgate runs; a series without a value for a whole hour (a model
 * unloaded long ago) is dropped, and past MAX_SERIES a new series is not kept (counted in `dropped`).
 */
export const SAMPLE_INTERVAL_MS = 5000
export const SAMPLES_KEPT = 720
export const MAX_SERIES = 64

/** TimeSample: one sample of every series at `t` (epoch ms); null: no value. */
export interface TimeSample {
  t: number
  values: Record<string, number | null>
}

/** TimeSeries: the ring in time order, as the API and the dashboard stream give it. */
export interface TimeSeries {
  interval_ms: number
  t: number[]
  series: Record<string, (number | null)[]>
}

export class TimeRing {
  private readonly times = new Float64Array(SAMPLES_KEPT)
  private readonly series = new Map<string, Float64Array>()
  /** Samples pushed since each series last had a value. */
  private readonly silentFor = new Map<string, number>()
  private next = 0
  private size = 0
  /** dropped: values not kept because MAX_SERIES series already existed. */
  dropped = 0

  constructor(private readonly slots = SAMPLES_KEPT) {}

  push(sample: TimeSample): void {
    const slot = this.next
    this.times[slot] = sample.t
    for (const [name, values] of this.series) {
      values[slot] = Number.NaN
      const silent = (this.silentFor.get(name) ?? 0) + 1
      if (silent >= this.slots) {
        this.series.delete(name)
        this.silentFor.delete(name)
      } else this.silentFor.set(name, silent)
    }
    for (const name in sample.values) {
      const v = sample.values[name]
      if (v === null || v === undefined || !Number.isFinite(v)) continue
      let values = this.series.get(name)
      if (!values) {
        if (this.series.size >= MAX_SERIES) {
          this.dropped++
          continue
        }
        values = new Float64Array(this.slots).fill(Number.NaN)
        this.series.set(name, values)
      }
      values[slot] = v
      this.silentFor.set(name, 0)
    }
    this.next = (slot + 1) % this.slots
    this.size = Math.min(this.size + 1, this.slots)
  }

  /** snapshot: every kept sample, oldest first. */
  snapshot(): TimeSeries {
    const start = (this.next - this.size + this.slots) % this.slots
    const order = Array.from({ length: this.size }, (_, i) => (start + i) % this.slots)
    const series: Record<string, (number | null)[]> = {}
    for (const [name, values] of this.series)
      series[name] = order.map((slot) => (Number.isNaN(values[slot]!) ? null : values[slot]!))
    return { interval_ms: SAMPLE_INTERVAL_MS, t: order.map((slot) => this.times[slot]!), series }
  }
}
