import { encodeRequest, type HttpStreamClient } from './http-stream.ts'
import { seededRandom } from './random.ts'
import { type InFlight, type RequestSample, sendStreamingRequest } from './request.ts'
import type { ScenarioRecorder } from './statistics.ts'

/**
 * runScenarioLoad drives one scenario's traffic: a closed-loop warmup whose results are thrown
 * away, then the measured phase, either closed loop (`concurrency` requests always in flight, the
 * way `vllm bench serve --max-concurrency` behaves) or open loop (Poisson arrivals at
 * `requestRate`, with `concurrency` capping requests in flight, like vLLM's `--request-rate`).
 * Every finished measured request goes to the recorder; failures are recorded, never dropped.
 */
export interface LoadPlan {
  url: URL
  headers: Record<string, string>
  /** body returns the JSON body of request `i` (warmup requests count from -1 down). */
  body(i: number): string
  requestIdPrefix: string
  concurrency: number
  warmupRequests: number
  totalRequests: number
  requestRate: number | null
  requestTimeoutMs: number
  /** seed of the Poisson arrival process (fixed, so runs are comparable). */
  seed?: number
}

export interface LoadHooks {
  /** beforeMeasure is awaited between warmup and the measured phase (the contention barrier). */
  beforeMeasure?(): Promise<void>
  /** measuring: the measured phase starts now. */
  measuring?(): void
  warmup?(completed: number, total: number): void
  progress?(completed: number): void
  sample?(sample: RequestSample, requestId: string): void
}

export interface LoadOutcome {
  /** durationSec: measured phase wall clock, first send → last response end. */
  durationSec: number
  cancelled: boolean
}

export async function runScenarioLoad(
  client: HttpStreamClient,
  plan: LoadPlan,
  recorder: ScenarioRecorder,
  signal: AbortSignal,
  hooks: LoadHooks = {},
): Promise<LoadOutcome> {
  if (plan.warmupRequests > 0) {
    let warm = 0
    const outcome = await runPhase(client, plan, signal, {
      count: plan.warmupRequests,
      concurrency: Math.min(plan.concurrency, plan.warmupRequests),
      rate: null,
      index: (k) => -1 - k,
      done: () => hooks.warmup?.(++warm, plan.warmupRequests),
    })
    if (outcome.cancelled) return { durationSec: 0, cancelled: true }
  }
  await preconnect(client, plan, Math.min(plan.concurrency, plan.totalRequests), signal)
  await hooks.beforeMeasure?.()
  if (signal.aborted) return { durationSec: 0, cancelled: true }
  hooks.measuring?.()
  let finished = 0
  return runPhase(client, plan, signal, {
    count: plan.totalRequests,
    concurrency: plan.concurrency,
    rate: plan.requestRate,
    index: (k) => k,
    collectItl: true,
    done: (sample, id) => {
      recorder.add(sample)
      hooks.sample?.(sample, id)
      hooks.progress?.(++finished)
    },
  })
}

interface Phase {
  count: number
  concurrency: number
  rate: number | null
  index(k: number): number
  collectItl?: boolean
  done(sample: RequestSample, requestId: string): void
}

function runPhase(
  client: HttpStreamClient,
  plan: LoadPlan,
  signal: AbortSignal,
  phase: Phase,
): Promise<LoadOutcome> {
  return new Promise((resolve) => {
    const active = new Set<InFlight>()
    let issued = 0
    let finished = 0
    let waiting = 0 // open loop: arrivals waiting for a free slot
    let arrivals = 0
    let stopped = false
    let firstSend = -1
    let lastEnd = -1
    let arrivalTimer: ReturnType<typeof setTimeout> | undefined
    const sweeper = setInterval(
      () => {
        const now = performance.now()
        for (const f of active) {
          if (now - f.sendAt > plan.requestTimeoutMs)
            f.abort(`request timed out after ${plan.requestTimeoutMs} ms`, false)
        }
      },
      Math.min(1000, plan.requestTimeoutMs),
    )

    const finish = (cancelled: boolean) => {
      clearInterval(sweeper)
      if (arrivalTimer) clearTimeout(arrivalTimer)
      signal.removeEventListener('abort', onAbort)
      const durationSec = firstSend < 0 || lastEnd < firstSend ? 0 : (lastEnd - firstSend) / 1000
      resolve({ durationSec, cancelled })
    }

    const launch = () => {
      const k = issued++
      const i = phase.index(k)
      const id = `${plan.requestIdPrefix}-${i < 0 ? `w${-1 - i}` : i}`
      const payload = encodeRequest(plan.url, { ...plan.headers, 'x-request-id': id }, plan.body(i))
      const f = sendStreamingRequest(client, plan.url, payload, phase.collectItl === true)
      if (firstSend < 0) firstSend = f.sendAt
      active.add(f)
      f.done.then((sample) => {
        active.delete(f)
        finished++
        if (!sample.cancelled && sample.endAt > lastEnd) lastEnd = sample.endAt
        phase.done(sample, id)
        if (stopped) {
          if (active.size === 0) finish(true)
          return
        }
        if (finished === phase.count) finish(false)
        else pump()
      })
    }

    const pump = () => {
      if (stopped) return
      if (phase.rate === null) {
        while (active.size < phase.concurrency && issued < phase.count) launch()
        return
      }
      while (waiting > 0 && active.size < phase.concurrency) {
        waiting--
        launch()
      }
    }

    const onAbort = () => {
      stopped = true
      if (arrivalTimer) clearTimeout(arrivalTimer)
      if (active.size === 0) return finish(true)
      for (const f of [...active]) f.abort('cancelled', true)
    }
    if (signal.aborted) return finish(true)
    signal.addEventListener('abort', onAbort, { once: true })

    if (phase.rate !== null) {
      // Poisson arrivals: exponential gaps with mean 1/rate, scheduled against the phase start
      // so timer lateness never lowers the offered rate.
      const rnd = seededRandom(plan.seed ?? 0)
      const start = performance.now()
      let due = 0
      const arrive = () => {
        if (stopped) return
        const now = performance.now() - start
        while (arrivals < phase.count && due <= now) {
          arrivals++
          waiting++
          due += (-Math.log(1 - rnd()) / phase.rate!) * 1000
        }
        pump()
        if (arrivals < phase.count)
          arrivalTimer = setTimeout(arrive, Math.max(0, due - (performance.now() - start)))
      }
      arrive()
    } else pump()
  })
}

/** preconnect opens up to `n` keep-alive connections before the measured phase starts. */
async function preconnect(
  client: HttpStreamClient,
  plan: LoadPlan,
  n: number,
  signal: AbortSignal,
): Promise<void> {
  if (signal.aborted) return
  await client.preconnect(plan.url, n, AbortSignal.any([signal, AbortSignal.timeout(10_000)]))
}
