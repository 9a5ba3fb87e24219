/**
 * PortAllocator hands out engine ports from a configured range: never a port another instance
 * holds, and only ports that are actually free on the host right now (checked by binding).
 */
export function portIsFree(host: string, port: number): boolean {
  try {
    const server = Bun.listen({ hostname: host, port, socket: { data() {} } })
    server.stop(true)
    return true
  } catch {
    return false
  }
}

export class PortAllocator {
  private next: number

  constructor(
    private readonly host: string,
    private readonly start: number,
    private readonly end: number,
  ) {
    this.next = start
  }

  /** allocate returns a free port not in `taken`, scanning round-robin from the last one given. */
  allocate(taken: ReadonlySet<number>): number | null {
    const size = this.end - this.start + 1
    for (let i = 0; i < size; i++) {
      const port = this.start + ((this.next - this.start + i) % size)
      if (taken.has(port)) continue
      if (!portIsFree(this.host, port)) continue
      this.next = port + 1 > this.end ? this.start : port + 1
      return port
    }
    return null
  }
}
