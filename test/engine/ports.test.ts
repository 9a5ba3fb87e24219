import { afterEach, describe, expect, it } from 'bun:test'
import { PortAllocator, type PortClaim } from '../../src/engine/ports.ts'
import { bindTcp } from '../../src/engine/tcp-bind.ts'
import { exclusivelyFree, freePortRange } from '../support/ports.ts'

/**
 * The engine port allocator against real sockets: what it claims, what it skips, and that the
 * engine can still bind the port it was given.
 */
const HOST = '127.0.0.1'
const cleanups: (() => unknown)[] = []
afterEach(() => {
  for (const f of cleanups.splice(0).reverse()) f()
})

function kept(claim: PortClaim | null): PortClaim {
  expect(claim).not.toBeNull()
  cleanups.push(() => claim!.release())
  return claim!
}

describe('engine port allocator', () => {
  it('keeps a claimed port from another modelgate sharing the range, while its engine can bind it', async () => {
    const p = freePortRange(3)
    const [a, b] = [new PortAllocator(HOST, p, p + 2), new PortAllocator(HOST, p, p + 2)]
    const claim = kept(a.allocate(new Set()))
    expect(claim.port).toBe(p)
    expect(kept(b.allocate(new Set())).port).toBe(p + 1)
    // The engine binds and listens as servers do (SO_REUSEADDR), beside the claim.
    const engine = Bun.serve({ hostname: HOST, port: p, fetch: () => new Response('engine') })
    cleanups.push(() => engine.stop(true))
    expect(await (await fetch(`http://${HOST}:${p}/`, { keepalive: false })).text()).toBe('engine')
    claim.release()
    expect(kept(b.allocate(new Set([p + 1]))).port).toBe(p + 2)
    expect(b.allocate(new Set([p + 1, p + 2]))).toBeNull()
  })

  it('skips ports this modelgate gave out and ports others hold, listening or only bound', () => {
    const p = freePortRange(4)
    const listener = Bun.listen({ hostname: HOST, port: p, socket: { data() {} } })
    cleanups.push(() => listener.stop(true))
    // An engine still loading: bound with SO_REUSEADDR and SO_REUSEPORT, as vLLM does, not listening.
    const loading = bindTcp(HOST, p + 1, { reuseAddr: true, reusePort: true })
    expect(loading?.ok).toBe(true)
    if (loading?.ok) cleanups.push(() => loading.socket.close())
    const ports = new PortAllocator(HOST, p, p + 3)
    expect(kept(ports.allocate(new Set([p + 2]))).port).toBe(p + 3)
  })

  it('prefers a port with no closed connections left, else takes one nothing listens on', async () => {
    const p = freePortRange(2)
    // An engine on p stops with a connection open: its side closes first and stays in TIME_WAIT.
    const engine = Bun.serve({ hostname: HOST, port: p, fetch: () => new Response('x') })
    await (await fetch(`http://${HOST}:${p}/`)).text()
    engine.stop(true)
    expect(exclusivelyFree(p)).toBe(false)
    expect(kept(new PortAllocator(HOST, p, p + 1).allocate(new Set())).port).toBe(p + 1)
    expect(kept(new PortAllocator(HOST, p, p).allocate(new Set())).port).toBe(p)
  })

  it('claims a port a load asks for unless something listens there', () => {
    const p = freePortRange(2)
    const ports = new PortAllocator(HOST, 1024, 1024)
    const listener = Bun.listen({ hostname: HOST, port: p, socket: { data() {} } })
    cleanups.push(() => listener.stop(true))
    expect(ports.claim(p)).toBeNull()
    expect(kept(ports.claim(p + 1)).port).toBe(p + 1)
    expect(exclusivelyFree(p + 1)).toBe(false)
  })
})
