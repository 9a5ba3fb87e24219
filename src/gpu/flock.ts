import { dlopen, FFIType } from 'bun:ffi'

/**
 * flock gives TypeScript libc's flock(2) through bun:ffi, the lock kvcached's readers and writers
 * take on its usage segment. Where libc cannot be loaded it degrades to no lock (a single aligned
 * 24-byte read or write is then the only protection, which is enough for three counters).
 */
export const LOCK_SH = 1
export const LOCK_EX = 2
const LOCK_NB = 4
const LOCK_UN = 8
const TRY_ATTEMPTS = 20

type Flock = (fd: number, op: number) => number
let bound: Flock | null | undefined

function flockFn(): Flock | null {
  if (bound !== undefined) return bound
  bound = null
  for (const lib of ['libc.so.6', 'libc.so', 'libc.dylib']) {
    try {
      const { symbols } = dlopen(lib, { flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 } })
      bound = (fd, op) => symbols.flock(fd, op) as number
      break
    } catch {
      // not this platform's libc: try the next name, else go on without locks
    }
  }
  return bound
}

/**
 * withLock runs fn under flock(fd, op). `wait: false` (readers on the event loop) tries a few
 * times without blocking and runs unlocked rather than stall; the default waits for the lock.
 */
export function withLock<T>(fd: number, op: number, fn: () => T, opts: { wait?: boolean } = {}): T {
  const flock = flockFn()
  let locked = false
  if (flock) {
    if (opts.wait === false) {
      for (let i = 0; i < TRY_ATTEMPTS && !locked; i++) locked = flock(fd, op | LOCK_NB) === 0
    } else locked = flock(fd, op) === 0
  }
  try {
    return fn()
  } finally {
    if (locked) flock?.(fd, LOCK_UN)
  }
}
