/**
 * flock exposes libc's flock(2) through bun:ffi so the simulator locks the kvcached segment the way
 * kvcached's readers expect. Where libc cannot be loaded it degrades to a no-op (a single 24-byte pwrite
 * is then the only protection).
 */
export const LOCK_SH = 1
export const LOCK_EX = 2
export const LOCK_UN = 8

type FlockFn = (fd: number, op: number) => number

let cached: FlockFn | null | undefined

async function load(): Promise<FlockFn | null> {
  try {
    const { dlopen, FFIType } = await import('bun:ffi')
    for (const name of ['libc.so.6', 'libc.so', 'libc.dylib']) {
      try {
        const lib = dlopen(name, { flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 } })
        return (fd, op) => lib.symbols.flock(fd, op) as number
      } catch {}
    }
  } catch {}
  return null
}

/** initFlock loads libc once; call it before using withLock. */
export async function initFlock(): Promise<boolean> {
  if (cached === undefined) cached = await load()
  return cached !== null
}

/** withLock runs fn under flock(fd, op) when available; it always unlocks. */
export function withLock<T>(fd: number, op: number, fn: () => T): T {
  const flock = cached ?? null
  if (flock) flock(fd, op)
  try {
    return fn()
  } finally {
    if (flock) flock(fd, LOCK_UN)
  }
}
