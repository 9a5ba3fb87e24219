/**
 * VllmClient speaks the engine's control endpoints (health, sleep, wake, is_sleeping, metrics),
 * each with a deadline so a hung engine never hangs a request of ours.
 */
export class EngineCallError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
  ) {
    super(message)
    this.name = 'EngineCallError'
  }
}

export class VllmClient {
  constructor(
    readonly baseUrl: string,
    private readonly timeoutMs = 10000,
  ) {}

  private async call(method: string, path: string, timeoutMs = this.timeoutMs): Promise<Response> {
    let res: Response
    try {
      res = await fetch(`${this.baseUrl}${path}`, { method, signal: AbortSignal.timeout(timeoutMs) })
    } catch (err) {
      const e = err as Error
      const why = e.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : e.message
      throw new EngineCallError(`engine ${method} ${path} failed: ${why}`, null)
    }
    if (!res.ok) {
      const text = (await res.text().catch(() => '')).slice(0, 300)
      throw new EngineCallError(
        `engine ${method} ${path} answered ${res.status}${text ? `: ${text}` : ''}`,
        res.status,
      )
    }
    return res
  }

  /** health: true on 200, false on anything else (including connection refused). */
  async health(timeoutMs = 2000): Promise<boolean> {
    try {
      const res = await fetch(`${this.baseUrl}/health`, { signal: AbortSignal.timeout(timeoutMs) })
      await res.body?.cancel()
      return res.status === 200
    } catch {
      return false
    }
  }

  async sleep(level: 1 | 2): Promise<void> {
    await (await this.call('POST', `/sleep?level=${level}`, 120000)).body?.cancel()
  }

  async wake(tags: string[] = []): Promise<void> {
    const q = tags.map((t) => `tags=${encodeURIComponent(t)}`).join('&')
    await (await this.call('POST', `/wake_up${q ? `?${q}` : ''}`, 300000)).body?.cancel()
  }

  async isSleeping(): Promise<boolean> {
    const body = (await (await this.call('GET', '/is_sleeping', 5000)).json()) as { is_sleeping?: unknown }
    return body.is_sleeping === true
  }

  /** metric reads one gauge from the engine's /metrics (summed over label sets), or null. */
  async metric(names: string[]): Promise<number | null> {
    const text = await (await this.call('GET', '/metrics', 3000)).text()
    for (const name of names) {
      let sum = 0
      let seen = false
      for (const line of text.split('\n')) {
        if (!line.startsWith(name)) continue
        const rest = line.slice(name.length)
        if (rest[0] !== ' ' && rest[0] !== '{') continue
        const v = Number(line.slice(line.lastIndexOf(' ') + 1))
        if (Number.isFinite(v)) {
          sum += v
          seen = true
        }
      }
      if (seen) return sum
    }
    return null
  }
}

/** waitHealthy polls /health with exponential backoff until 200, `stop()` says give up, or the deadline. */
export async function waitHealthy(
  client: VllmClient,
  opts: { initialMs: number; maxMs: number; deadlineMs: number; stop: () => boolean },
): Promise<'healthy' | 'stopped' | 'timeout'> {
  const until = Date.now() + opts.deadlineMs
  let delay = opts.initialMs
  while (Date.now() < until) {
    if (opts.stop()) return 'stopped'
    if (await client.health(Math.min(2000, Math.max(200, until - Date.now())))) return 'healthy'
    if (opts.stop()) return 'stopped'
    await Bun.sleep(Math.min(delay, Math.max(0, until - Date.now())))
    delay = Math.min(opts.maxMs, Math.round(delay * 1.5))
  }
  return 'timeout'
}
