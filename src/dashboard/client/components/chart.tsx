/**
 * BarChart: grouped bars in SVG, drawn here rather than with a chart library: the benchmark views
 * are a handful of percentiles per run, not time series, so a few rectangles do (uPlot, the issue's
 * example, is a time-series plotter and would add ~45 KB for this). Each bar carries its value in
 * `data-value` and a <title> for the pointer; the scale starts at 0 so heights compare honestly.
 */
export interface Bar {
  label: string
  value: number | null | undefined
  /** series index: the colour (0 and 1 for a comparison of two runs) */
  series?: number
}

export interface BarGroup {
  label: string
  bars: Bar[]
}

const W = 560
const H = 200
const PAD = { left: 48, right: 8, top: 12, bottom: 36 }

export function BarChart(props: { title: string; unit: string; groups: BarGroup[]; id?: string }) {
  const values = props.groups.flatMap((g) => g.bars.map((b) => b.value ?? 0))
  const max = niceMax(Math.max(0, ...values))
  const plotW = W - PAD.left - PAD.right
  const plotH = H - PAD.top - PAD.bottom
  const groupW = plotW / Math.max(1, props.groups.length)
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => f * max)
  const y = (v: number) => PAD.top + plotH - (max > 0 ? (v / max) * plotH : 0)
  return (
    <figure class="chart" data-chart={props.id ?? props.title}>
      <figcaption>
        {props.title} <span class="muted small">({props.unit})</span>
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={props.title}>
        {ticks.map((t) => (
          <g key={t}>
            <line class="grid" x1={PAD.left} x2={W - PAD.right} y1={y(t)} y2={y(t)} />
            <text class="tick" x={PAD.left - 6} y={y(t) + 4} text-anchor="end">
              {fmt(t)}
            </text>
          </g>
        ))}
        {props.groups.map((g, gi) => {
          const barW = (groupW * 0.8) / Math.max(1, g.bars.length)
          const x0 = PAD.left + gi * groupW + groupW * 0.1
          return (
            <g key={g.label} data-group={g.label}>
              {g.bars.map((b, bi) => {
                const v = b.value ?? 0
                return (
                  <rect
                    key={b.label}
                    class={`chart-bar series-${b.series ?? 0}`}
                    data-bar={b.label}
                    data-value={b.value ?? ''}
                    x={x0 + bi * barW}
                    y={y(v)}
                    width={Math.max(1, barW - 2)}
                    height={Math.max(0, PAD.top + plotH - y(v))}
                  >
                    <title>
                      {g.label} {b.label}:{' '}
                      {b.value === null || b.value === undefined ? '—' : `${fmt(v)} ${props.unit}`}
                    </title>
                  </rect>
                )
              })}
              <text class="tick" x={x0 + (groupW * 0.8) / 2} y={H - PAD.bottom + 16} text-anchor="middle">
                {g.label}
              </text>
            </g>
          )
        })}
      </svg>
    </figure>
  )
}

function niceMax(v: number): number {
  if (v <= 0) return 1
  const p = 10 ** Math.floor(Math.log10(v))
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p
  return 10 * p
}

function fmt(v: number): string {
  if (v >= 100) return String(Math.round(v))
  if (v >= 10) return v.toFixed(1)
  return v.toFixed(2)
}
