import { dlopen, FFIType, read } from 'bun:ffi'
import { isIPv4, isIPv6 } from 'node:net'
import { endianness } from 'node:os'

/**
 * bindTcp binds a TCP socket to host:port through libc (bun:ffi) with exactly the socket options
 * asked for, and leaves it bound but not listening. Bun's own listeners cannot do that: Bun.listen
 * and Bun.serve always set SO_REUSEADDR (and Bun.serve SO_REUSEPORT too unless told otherwise), and
 * Linux lets a SO_REUSEADDR bind share a port with any other SO_REUSEADDR socket that is bound but
 * not yet listening: exactly the state of a vLLM that is still loading (it binds its port before it
 * builds the engine and listens at the end). Only a bind without either option proves a port free.
 *
 * Linux only (the constants below are Linux's on x86-64 and arm64); elsewhere, without libc, or for
 * a host that is a name rather than an address, it returns null and the caller falls back.
 */
const AF_INET = 2
const AF_INET6 = 10
const SOCK_STREAM = 1
/** SOCK_CLOEXEC: an engine spawned while a socket is open must not inherit it. */
const SOCK_CLOEXEC = 0o2000000
const SOL_SOCKET = 1
const SO_REUSEADDR = 2
const SO_REUSEPORT = 15
const ERRNO_NAMES: Record<number, string> = {
  13: 'EACCES',
  22: 'EINVAL',
  97: 'EAFNOSUPPORT',
  98: 'EADDRINUSE',
  99: 'EADDRNOTAVAIL',
}

export interface SocketOptions {
  reuseAddr?: boolean
  reusePort?: boolean
}

/** BoundSocket: a socket bound to a port and not listening; close it to let the port go. */
export interface BoundSocket {
  readonly fd: number
  /** setOptions turns SO_REUSEADDR / SO_REUSEPORT on for binds that come after this one. */
  setOptions(opts: SocketOptions): void
  close(): void
}

export type BindOutcome = { ok: true; socket: BoundSocket } | { ok: false; errno: number; code: string }

function libc() {
  return dlopen('libc.so.6', {
    socket: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
    bind: { args: [FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
    setsockopt: {
      args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr, FFIType.u32],
      returns: FFIType.i32,
    },
    close: { args: [FFIType.i32], returns: FFIType.i32 },
    __errno_location: { args: [], returns: FFIType.ptr },
  }).symbols
}

let lib: ReturnType<typeof libc> | null | undefined

function symbols(): ReturnType<typeof libc> | null {
  if (lib !== undefined) return lib
  lib = null
  if (process.platform !== 'linux') return lib
  try {
    lib = libc()
  } catch {
    // no glibc here (musl, a stripped image): callers fall back to Bun's listeners
  }
  return lib
}

/** ipv4Bytes: the four bytes of a dotted IPv4 address, or null. */
export function ipv4Bytes(s: string): Uint8Array | null {
  if (!isIPv4(s)) return null
  return Uint8Array.from(s.split('.').map(Number))
}

/** ipv6Bytes: the sixteen bytes of an IPv6 address (`::` and an IPv4 tail allowed), or null. */
export function ipv6Bytes(s: string): Uint8Array | null {
  if (!isIPv6(s) || s.includes('%')) return null
  const out = new Uint8Array(16)
  let text = s
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)?.[1]
  if (tail) {
    out.set(ipv4Bytes(tail) ?? [], 12)
    text = `${text.slice(0, -tail.length)}0:0`
  }
  const [head = '', rest] = text.split('::')
  const before = head ? head.split(':') : []
  const after = rest === undefined ? [] : rest ? rest.split(':') : []
  const fill = rest === undefined ? 0 : 8 - before.length - after.length
  const groups = [...before, ...Array<string>(fill).fill('0'), ...after]
  groups.forEach((g, i) => {
    if (tail && i >= 6) return
    const v = Number.parseInt(g, 16)
    out[2 * i] = v >> 8
    out[2 * i + 1] = v & 0xff
  })
  return out
}

/** literalAddress: the address a host names without a lookup ('' and 'localhost' included), or null. */
export function literalAddress(host: string): { family: 4 | 6; bytes: Uint8Array } | null {
  const h = host.replace(/^\[(.*)\]$/, '$1')
  if (h === '' || h === 'localhost') return { family: 4, bytes: ipv4Bytes(h ? '127.0.0.1' : '0.0.0.0')! }
  const v4 = ipv4Bytes(h)
  if (v4) return { family: 4, bytes: v4 }
  const v6 = ipv6Bytes(h)
  return v6 ? { family: 6, bytes: v6 } : null
}

function sockaddr(family: 4 | 6, bytes: Uint8Array, port: number): Uint8Array {
  const buf = new Uint8Array(family === 4 ? 16 : 28)
  const view = new DataView(buf.buffer)
  // sa_family is in host byte order, the port in network order.
  view.setUint16(0, family === 4 ? AF_INET : AF_INET6, endianness() === 'LE')
  view.setUint16(2, port, false)
  buf.set(bytes, family === 4 ? 4 : 8)
  return buf
}

function errno(l: NonNullable<ReturnType<typeof symbols>>): { errno: number; code: string } {
  const where = l.__errno_location()
  const n = where ? read.i32(where, 0) : 0
  return { errno: n, code: ERRNO_NAMES[n] ?? `errno ${n}` }
}

function setFlag(l: NonNullable<ReturnType<typeof symbols>>, fd: number, option: number): boolean {
  return l.setsockopt(fd, SOL_SOCKET, option, new Int32Array([1]), 4) === 0
}

/** bindTcp: see the file comment. Null when this platform or host cannot be bound this way. */
export function bindTcp(host: string, port: number, opts: SocketOptions = {}): BindOutcome | null {
  const l = symbols()
  const addr = literalAddress(host)
  if (!l || !addr) return null
  const fd = l.socket(addr.family === 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0)
  if (fd < 0) return { ok: false, ...errno(l) }
  const options = (o: SocketOptions) =>
    (!o.reuseAddr || setFlag(l, fd, SO_REUSEADDR)) && (!o.reusePort || setFlag(l, fd, SO_REUSEPORT))
  if (!options(opts) || l.bind(fd, sockaddr(addr.family, addr.bytes, port), addr.family === 4 ? 16 : 28)) {
    const failure = errno(l)
    l.close(fd)
    return { ok: false, ...failure }
  }
  let open = true
  return {
    ok: true,
    socket: {
      fd,
      setOptions: (o) => void options(o),
      close() {
        if (open) l.close(fd)
        open = false
      },
    },
  }
}
