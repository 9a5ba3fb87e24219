import { useEffect, useRef } from 'preact/hooks'
import uPlot from 'uplot'
import { tick } from '../format.ts'
import type { TimeSeries } from '../types.ts'

/**
 * TimeChart: lines over the last hour, drawn by uPlot (bundled, canvas: 720 points × a few series
 * redrawn every 5 s is its job; the benchmark bars stay SVG, components/chart.tsx). uPlot styles its
 * elements through the DOM (`el.style`), never with a style sheet or attribute, so the page's CSP
 * (`style-src 'self'`) holds; its own rules come in the dashboard's stylesheet.
 *
 * The chart's element carries its uPlot instance as `uplot` (what it draws: `uplot.data`), for the
 * browser tests and the console.
 */
export interface Line {
  /** series: the name in the time series (`ttft_p99_ms`, `kv_cache_usage/<model>`). */
  series: string
  label: string
  color: string
}

const PALETTE = ['#2457c5', '#c62828', '#1a7f37', '#9a6700', '#6f42c1', '#0a7f8f', '#b35900', '#5a6472']

export function colorOf(i: number): string {
  return PALETTE[i % PALETTE.length]!
}

/** chartData: uPlot's columns (seconds, then one array per line) from the time series. */
export function chartData(ts: TimeSeries, lines: Line[]): uPlot.AlignedData {
  return [ts.t.map((t) => t / 1000), ...lines.map((l) => ts.series[l.series] ?? ts.t.map(() => null))]
}

export function TimeChart(props: { id: string; title: string; unit: string; ts: TimeSeries; lines: Line[] }) {
  const el = useRef<HTMLDivElement>(null)
  const plot = useRef<uPlot | null>(null)
  const shape = props.lines.map((l) => l.series).join('|')
  // (Re)build when the set of lines changes; otherwise only the data is replaced.
  useEffect(() => {
    const host = el.current
    if (!host) return
    const u = new uPlot(
      {
        width: Math.max(320, host.clientWidth || 560),
        height: 180,
        legend: { show: true },
        scales: {
          x: { time: true },
          y: { range: (_u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1] },
        },
        axes: [{}, { label: props.unit, size: 56, values: (_u, splits) => splits.map(tick) }],
        series: [
          {},
          ...props.lines.map((l) => ({ label: l.label, stroke: l.color, width: 2, spanGaps: false })),
        ],
      },
      chartData(props.ts, props.lines),
      host,
    )
    plot.current = u
    Object.defineProperty(host, 'uplot', { value: u, configurable: true })
    return () => {
      u.destroy()
      plot.current = null
    }
  }, [shape])
  useEffect(() => {
    plot.current?.setData(chartData(props.ts, props.lines))
  }, [props.ts])
  return (
    <section class="time-chart" aria-label={props.title}>
      <h3>{props.title}</h3>
      <div id={props.id} ref={el} data-lines={shape} />
    </section>
  )
}
