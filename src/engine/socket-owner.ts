import { readdirSync, readFileSync, readlinkSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { endianness } from 'node:os'
import { groupPids } from './process.ts'
import { literalAddress } from './tcp-bind.ts'

/**
 * portOwners tells who listens on a TCP port: the sockets in LISTEN state there (/proc/net/tcp and
 * tcp6), and for each the process holding it (the socket inode among a process's /proc/<pid>/fd
 * links), sorted into those of one process group (an engine: vLLM's API server and its workers) and
 * the others. With SO_REUSEPORT two processes of one user may listen on one port and the kernel
 * spreads connections between them, and a process may take a port between the moment it was found
 * free and the engine's own bind: a 200 on /health proves neither that the engine we started answers
 * nor that it answers alone. Linux only; null where /proc/net/tcp cannot be read.
 */
export interface PortListener {
  /** address:port as it would be written in a URL (`127.0.0.1:8100`, `[::]:8100`) */
  address: string
  inode: number
  pid: number | null
  /** the holder's command line (from /proc/<pid>/cmdline), when it could be read */
  command: string | null
}

export interface PortOwners {
  /** sockets held by the process group */
  ours: PortListener[]
  /** sockets held by anyone else (pid null: a process we may not inspect, e.g. another user's) */
  others: PortListener[]
}

const TCP_LISTEN = '0A'

interface RawListener {
  bytes: Uint8Array
  family: 4 | 6
  inode: number
}

/** hexAddress decodes /proc/net/tcp's address: 32-bit words printed in host byte order. */
function hexAddress(hex: string): Uint8Array {
  const out = new Uint8Array(hex.length / 2)
  for (let w = 0; w < hex.length / 8; w++) {
    const word = Number.parseInt(hex.slice(w * 8, w * 8 + 8), 16)
    new DataView(out.buffer).setUint32(w * 4, word, endianness() === 'LE')
  }
  return out
}

/**
 * listening reads the LISTEN sockets on `port` from both tables, asynchronously: the kernel walks
 * its whole connection hash table for each read (several ms on a large host), which must not stall
 * the event loop that proxies requests.
 */
async function listening(port: number): Promise<RawListener[] | null> {
  const tables = await Promise.all(
    (['/proc/net/tcp', '/proc/net/tcp6'] as const).map((file) => readFile(file, 'utf8').catch(() => null)),
  )
  if (tables.every((t) => t === null)) return null
  const out: RawListener[] = []
  tables.forEach((text, i) => {
    for (const line of text?.split('\n').slice(1) ?? []) {
      const f = line.trim().split(/\s+/)
      if (f[3] !== TCP_LISTEN || !f[1]) continue
      const [addr = '', portHex = ''] = f[1].split(':')
      if (Number.parseInt(portHex, 16) !== port) continue
      out.push({ bytes: hexAddress(addr), family: i === 0 ? 4 : 6, inode: Number(f[9]) })
    }
  })
  return out
}

function formatAddress(l: RawListener, port: number): string {
  if (l.family === 4) return `${[...l.bytes].join('.')}:${port}`
  const groups: string[] = []
  for (let i = 0; i < 16; i += 2) groups.push((((l.bytes[i] ?? 0) << 8) | (l.bytes[i + 1] ?? 0)).toString(16))
  return `[${groups.join(':').replace(/(^|:)0(:0)+(:|$)/, '::')}]:${port}`
}

const equal = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((x, i) => x === b[i])

/**
 * reaches tells whether a listener receives connections made to `target` (the engine's address as
 * the gateway dials it): a wildcard listener does, as does one on that address (IPv4-mapped too).
 */
function reaches(l: RawListener, target: { family: 4 | 6; bytes: Uint8Array } | null): boolean {
  if (!target || l.bytes.every((b) => b === 0)) return true
  if (l.family === target.family) return equal(l.bytes, target.bytes)
  if (l.family === 6 && target.family === 4)
    return (
      equal(l.bytes.subarray(0, 12), Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255)) &&
      equal(l.bytes.subarray(12), target.bytes)
    )
  return false
}

/** socketInodes: the socket inodes among the open files of `pid` (empty when it cannot be read). */
function socketInodes(pid: number): Set<number> {
  const out = new Set<number>()
  let fds: string[]
  try {
    fds = readdirSync(`/proc/${pid}/fd`)
  } catch {
    return out
  }
  for (const fd of fds) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (m) out.add(Number(m[1]))
    } catch {
      // closed meanwhile
    }
  }
  return out
}

function commandLine(pid: number): string | null {
  try {
    const text = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ')
    return text ? text.slice(0, 200) : null
  } catch {
    return null
  }
}

/** holders finds the process holding each inode by walking /proc (only when someone else listens). */
function holders(inodes: Set<number>): Map<number, number> {
  const found = new Map<number, number>()
  let entries: string[]
  try {
    entries = readdirSync('/proc')
  } catch {
    return found
  }
  for (const name of entries) {
    if (found.size === inodes.size) break
    if (!/^\d+$/.test(name)) continue
    for (const inode of socketInodes(Number(name))) if (inodes.has(inode)) found.set(inode, Number(name))
  }
  return found
}

/**
 * portOwners: the listeners on `port` that take connections for `host` (the engine's --host; a
 * wildcard is dialled on loopback), sorted by whether process group `pgid` holds them.
 */
export async function portOwners(port: number, host: string, pgid: number): Promise<PortOwners | null> {
  const raw = await listening(port)
  if (!raw) return null
  const dialled = host === '0.0.0.0' || host === '' ? '127.0.0.1' : host === '::' ? '::1' : host
  const target = literalAddress(dialled)
  const relevant = raw.filter((l) => reaches(l, target))
  const mine = new Map<number, number>()
  for (const pid of groupPids(pgid)) for (const inode of socketInodes(pid)) mine.set(inode, pid)
  const foreign = new Set(relevant.filter((l) => !mine.has(l.inode)).map((l) => l.inode))
  const theirs = foreign.size ? holders(foreign) : new Map<number, number>()
  const owners: PortOwners = { ours: [], others: [] }
  for (const l of relevant) {
    const pid = mine.get(l.inode) ?? theirs.get(l.inode) ?? null
    const entry = {
      address: formatAddress(l, port),
      inode: l.inode,
      pid,
      command: pid ? commandLine(pid) : null,
    }
    ;(mine.has(l.inode) ? owners.ours : owners.others).push(entry)
  }
  return owners
}
