import { readFileSync } from 'node:fs'

/**
 * openFileLimit: this process's soft limit on open files (RLIMIT_NOFILE), read from
 * /proc/self/limits; `fallback` where that cannot be read (not Linux).
 */
export function openFileLimit(fallback = 1024): number {
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'))
    const soft = line?.slice('Max open files'.length).trim().split(/\s+/)[0]
    if (soft === 'unlimited') return 1 << 20
    const n = Number(soft)
    return Number.isInteger(n) && n > 0 ? n : fallback
  } catch {
    return fallback
  }
}

/** Descriptors kept for everything that is not a client connection: engines' pipes, logs, SQLite, probes. */
const HEADROOM = 256

/**
 * connectionCap: client connections a listener may hold by default. A proxied request holds its
 * client connection and an upstream one, a relayed request also the framework's two ends of its
 * socket: three descriptors at most, after a fixed headroom. With the default 20 000 files that is
 * 6 581 connections a listener; past it new ones are closed at once, before accept() could fail.
 */
export function connectionCap(limit = openFileLimit()): number {
  return Math.max(64, Math.floor((limit - HEADROOM) / 3))
}
