/**
 * directory (`npm run bench:directory`): what the model directory (src/directory) costs one request
 * by itself, in-process, with the sockets, parser and engine taken out: `plan` (the candidates, their
 * order, the lease) and the lease's end (the backend's count released, the end announced on the bus,
 * the listener's books), for a model served by one backend and by three (the order sorts them).
 *
 * Its baseline, in the same run: what a route did before the directory existed, for the same
 * request: its forward action built directly, with an end that releases one in-flight count and
 * records the request once (the shape of the router's old `send`/`ender`). The difference is the
 * directory's own cost per request, to be read beside a whole proxied request's CPU (bench:paired,
 * about 55-70 µs on the 2-core CI box). Each figure is measured with `proxy.request` heard (a
 * listener counts it, as the gateway's metrics do) and unheard (the router alone: nothing builds
 * the event).
 *
 * `--baseline DIR`: another tree's directory is measured too, in the same process, rounds
 * alternated (e.g. a change to the directory against the commit before it, in a worktree).
 *
 *   bun test/perf/directory.ts [--requests 1000000] [--rounds 12] [--baseline DIR]
 */
import { resolve } from 'node:path'
import { Registry } from 'prom-client'
import type { Backend, BackendRequest, LeaseHandle, Readiness } from '../../src/directory/backend.ts'
import type { ModelDirectory as Directory, ListenerPlan } from '../../src/directory/directory.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import { BodyRange } from '../../src/wire/body-range.ts'
import type { ScannedJson } from '../../src/wire/json-scan.ts'
import type { ForwardEnd, WireAction } from '../../src/wire/route.ts'
import { numberArg, stringArg } from './args.ts'

const REQUESTS = numberArg('--requests', 1_000_000)
const ROUNDS = numberArg('--rounds', 12)
const BASELINE = stringArg('--baseline', '')

const PATH = '/v1/chat/completions'
const ORIGIN = 'http://127.0.0.1:8000'
const BODY = BodyRange.EMPTY
const JSON_SCAN = null as unknown as ScannedJson
const END: ForwardEnd = { status: 200, bytes: 1, durationMs: 1, ttftMs: 1, streamed: false, aborted: false }

/** A backend as the router's endpoints are: always ready, a counter, a forward to its origin. */
class BenchBackend implements Backend {
  readonly kind = 'endpoint'
  readonly local = true
  open = 0
  constructor(
    readonly key: string,
    readonly model: string,
  ) {}
  readiness(): Readiness {
    return 'ready'
  }
  inFlight(): number {
    return this.open
  }
  acquire(): void {
    this.open++
  }
  release(): void {
    this.open--
  }
  forward(req: BackendRequest, lease: LeaseHandle): WireAction {
    return {
      forward: {
        origin: ORIGIN,
        target: req.path + req.query,
        body: req.body,
        firstByteTimeoutMs: req.firstByteTimeoutMs,
        connectTimeoutMs: req.connectTimeoutMs,
        onEnd: lease.end,
      },
    }
  }
}

type Case = { name: string; run: () => void; check: () => string | null }

const silent = new Logger('error', 'bench', 'text', () => {})

/** directoryCases: plan + end through `Dir` (this tree's ModelDirectory, or a baseline tree's). */
function directoryCases(label: string, Dir: typeof Directory): Case[] {
  const out: Case[] = []
  for (const heard of [true, false]) {
    for (const count of [1, 3]) {
      const bus = new EventBus()
      let seen = 0
      if (heard) bus.on('proxy.request', () => seen++)
      const dir = new Dir(bus, silent, new Registry())
      const list = Array.from({ length: count }, (_, i) => new BenchBackend(`endpoint:m${i}`, 'm'))
      dir.addSource({ backends: (name) => (name === 'm' ? list : []) })
      let booked = 0
      const plan: ListenerPlan = {
        kinds: new Set(['endpoint']),
        policy: 'reject',
        holdTimeoutMs: 1000,
        answers: {} as ListenerPlan['answers'],
        books: { ended: () => booked++ },
      }
      let runs = 0
      const req = {
        path: PATH,
        enginePath: PATH,
        query: '',
        body: BODY,
        json: JSON_SCAN,
        startedAt: 0,
        firstByteTimeoutMs: 1,
        connectTimeoutMs: 1,
        grant: null,
        trace: null,
      }
      out.push({
        name: `${label}: ${count} backend${count > 1 ? 's' : ''}, proxy.request ${heard ? 'heard' : 'unheard'}`,
        run: () => {
          runs++
          const action = dir.plan('m', { ...req }, plan)
          if (!('forward' in action)) throw new Error('the directory did not forward')
          action.forward.onEnd(END)
        },
        check: () => {
          const open = list.reduce((n, b) => n + b.open, 0)
          if (open !== 0) return `${open} leases left open`
          if (booked !== runs) return `${booked} ends booked of ${runs}`
          if (heard && seen !== runs) return `${seen} events of ${runs}`
          return null
        },
      })
    }
  }
  return out
}

/** direct: the route's own forward before the directory (one count, one end recorded once). */
function directCase(): Case {
  let open = 0
  let recorded = 0
  let runs = 0
  const ender = (): ((info: ForwardEnd) => void) => {
    let ended = false
    return (info) => {
      if (ended) return
      ended = true
      open--
      if (info.status >= 200) recorded++
    }
  }
  const req = { path: PATH, query: '', body: BODY }
  return {
    name: 'baseline: the route forwards directly (before the directory)',
    run: () => {
      runs++
      open++
      const r = { ...req }
      const action: WireAction = {
        forward: {
          origin: ORIGIN,
          target: r.path + r.query,
          body: r.body,
          firstByteTimeoutMs: 1,
          connectTimeoutMs: 1,
          onEnd: ender(),
        },
      }
      if (!('forward' in action)) throw new Error('no forward')
      action.forward.onEnd(END)
    },
    check: () => (open !== 0 ? `${open} left open` : recorded !== runs ? `${recorded} of ${runs}` : null),
  }
}

const mine = (await import('../../src/directory/directory.ts')).ModelDirectory
const cases: Case[] = [directCase(), ...directoryCases('this tree', mine)]
if (BASELINE) {
  const theirs = (await import(resolve(BASELINE, 'src/directory/directory.ts'))).ModelDirectory
  cases.push(...directoryCases(`baseline ${BASELINE}`, theirs))
}

/** cpuNs: this process's CPU time (user + system) in ns. */
const cpuNs = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) * 1000
}

const figures = cases.map(() => [] as number[])
for (const c of cases) for (let i = 0; i < 50_000; i++) c.run() // warm-up: JIT
for (let r = 0; r < ROUNDS; r++) {
  // Alternated: each round measures every case once, so the machine's drift lands on all of them.
  for (let k = 0; k < cases.length; k++) {
    const c = cases[k]!
    const t0 = cpuNs()
    for (let i = 0; i < REQUESTS; i++) c.run()
    figures[k]!.push((cpuNs() - t0) / REQUESTS)
  }
}

const failed = cases.map((c) => c.check()).filter((x) => x !== null)
if (failed.length) {
  console.error(`wrong: ${failed.join('; ')}`)
  process.exit(1)
}
const sorted = figures.map((f) => [...f].sort((a, b) => a - b))
const base = sorted[0]![0]!
console.log(
  `\nthe directory's CPU per request, in-process (${ROUNDS} rounds of ${REQUESTS} requests, alternated; ns, min and median of rounds)\n`,
)
for (let k = 0; k < cases.length; k++) {
  const s = sorted[k]!
  const min = s[0]!
  const med = s[Math.floor(s.length / 2)]!
  const added = k === 0 ? '' : `  (+${(min - base).toFixed(0)} ns over the baseline)`
  console.log(
    `  ${cases[k]!.name.padEnd(64)} min ${min.toFixed(0).padStart(4)}  median ${med.toFixed(0).padStart(4)}${added}`,
  )
}
