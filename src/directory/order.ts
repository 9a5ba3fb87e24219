import type { Backend, Readiness } from './backend.ts'

/**
 * The one order among the backends that can serve a model, best first, used for every request on
 * every listener:
 *
 * 1. serving before sleeping (a wake costs the request time), sleeping before loading (a model
 *    loading, or one a request would load), loading before what cannot serve at all;
 * 2. among equals, this pod's own backends before another pod's (a hop costs a round trip);
 * 3. then a pod that failed to connect lately goes last;
 * 4. then the fewest requests in flight (least outstanding requests, as a load balancer picks);
 * 5. then the order the sources listed them in (stable).
 *
 * Another pod's backend that does not serve now is dropped when any backend of this pod exists:
 * a request goes to another pod only where the model runs, or when this pod has no instance of it
 * at all (then the pod that holds it wakes its own: waking it there is cheaper than loading it here,
 * so a model this pod could only load does not count as an instance of it).
 */
const RANK: Readonly<Record<Readiness, number>> = {
  ready: 0,
  asleep: 1,
  waking: 1,
  starting: 2,
  absent: 2,
  unavailable: 3,
}

export function orderBackends(backends: readonly Backend[]): readonly Backend[] {
  if (backends.length < 2) return backends
  const hasLocal = backends.some((b) => b.local && b.readiness() !== 'absent')
  const kept = hasLocal ? backends.filter((b) => b.local || b.readiness() === 'ready') : [...backends]
  if (kept.length < 2) return kept
  const keyed = kept.map((b, i) => ({
    b,
    i,
    rank: RANK[b.readiness()],
    remote: b.local ? 0 : 1,
    failed: b.failedRecently?.() ? 1 : 0,
    load: b.inFlight(),
  }))
  keyed.sort(
    (x, y) => x.rank - y.rank || x.remote - y.remote || x.failed - y.failed || x.load - y.load || x.i - y.i,
  )
  return keyed.map((k) => k.b)
}
