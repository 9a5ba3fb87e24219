import { bindTcp } from '../../src/engine/tcp-bind.ts'

/**
 * Port helpers for tests about engine ports. A fixed port is a poor choice there: a port a test used
 * keeps its closed connections in TIME_WAIT for a minute, which an exclusive bind counts, so a rerun
 * (or another suite on the machine) would see it taken.
 */

/** exclusivelyFree: an exclusive bind (no SO_REUSEADDR, no SO_REUSEPORT) on 127.0.0.1 passes. */
export function exclusivelyFree(port: number): boolean {
  const bound = bindTcp('127.0.0.1', port)
  if (bound?.ok) bound.socket.close()
  return bound?.ok === true
}

/** freePortRange: the first of `n` consecutive ports that are exclusively free now, from a random base. */
export function freePortRange(n: number): number {
  const from = 20_000 + Math.floor(Math.random() * 30_000)
  for (let base = from; base < 60_000; base += n) {
    if (Array.from({ length: n }, (_, i) => base + i).every(exclusivelyFree)) return base
  }
  throw new Error(`no ${n} consecutive free ports above ${from}`)
}
